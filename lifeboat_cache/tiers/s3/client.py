"""The S3 tier's requests: boto3 clients behind a small public surface (call, list, get_range, put, delete).

* Failures: every boto3/botocore/urllib3 exception becomes an `S3Error` (an OSError: the store's
  cooldown); its message is scrubbed of the resolved credentials, which are never logged.
* Two clients: the data path's (reads, the store's PUTs) has its timeouts cut so that
  `max_attempts` tries fit in the engine deadline; the background one (listing, trailers,
  background copies, eviction) uses `connect_timeout_s` / `read_timeout_s` as configured.
* Credentials: the standard AWS chain (env, profile, web identity, instance role), or a named
  `profile` (role chains as boto3 resolves them), or keys read from the env vars named by
  `access_key_id_env` / `secret_access_key_env` (the file never holds a secret).
* Operator options: `addressing_style`, `verify` / `ca_bundle`, `sse` (AES256 or aws:kms with
  `sse_kms_key_id`), `storage_class`, `retry_mode`, `max_concurrency`: per tier.
* Deletes: DeleteObjects, up to 1000 keys per request; single DeleteObject calls where the server
  refuses DeleteObjects (as ONTAP before 9.11.1 does), decided once per client.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any, Iterator

from ...config import TierSettings
from ...metrics import Counters

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError as e:  # pragma: no cover - exercised only without the [s3] extra
    raise ImportError("storage type 's3' needs boto3: pip install 'lifeboat-cache[s3]'") from e

log = logging.getLogger(__name__)

LIST_PAGE_KEYS = 1000  # ListObjectsV2 maximum
FIRST_LIST_PAGE_KEYS = 100  # a listing's first page is small: its pages are served sooner
DELETE_BATCH_KEYS = 1000  # DeleteObjects maximum
STALE_CODES = frozenset({"NoSuchKey", "404", "InvalidRange", "416"})
# DeleteObjects refused (ONTAP S3 before 9.11.1 answers NotImplemented): delete one key at a time
NO_MULTI_DELETE_CODES = frozenset({"NotImplemented", "501", "MethodNotAllowed", "405"})
# a PUT refused for the tier's options: Ceph RGW answers these to sse without its KMS (or over plain
# HTTP) and to a storage class its placement does not define, where AWS accepts both
REFUSED_OPTION_CODES = frozenset({"InvalidArgument", "InvalidRequest", "InvalidStorageClass",
                                  "InvalidEncryptionAlgorithmError", "KMS.NotFoundException", "NotImplemented"})
PUT_OPTION_NAMES = {"ServerSideEncryption": "sse", "SSEKMSKeyId": "sse_kms_key_id", "StorageClass": "storage_class"}


class S3Error(OSError):
    """An S3 request failed; `code` is the S3 error code or HTTP status, or '' for transport errors."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(errno.EIO, message)
        self.code = code


def make_session(settings: TierSettings) -> Any:
    """A boto3 session: a named profile, keys from the env vars the settings name, or the default chain."""
    if settings.access_key_id_env:
        names = (settings.access_key_id_env, settings.secret_access_key_env)
        missing = [n for n in names if not os.environ.get(n or "")]
        if missing:
            raise ValueError(f"s3 tier {settings.bucket}: environment variable(s) {', '.join(map(str, missing))} "
                             f"(named by access_key_id_env / secret_access_key_env) are not set; export them")
        token = os.environ.get(settings.session_token_env) if settings.session_token_env else None
        return boto3.session.Session(aws_access_key_id=os.environ[settings.access_key_id_env],
                                     aws_secret_access_key=os.environ[settings.secret_access_key_env or ""],
                                     aws_session_token=token)
    if settings.profile:
        return boto3.session.Session(profile_name=settings.profile)
    return boto3.session.Session()


def data_path_timeouts(settings: TierSettings, deadline_s: float) -> tuple[float, float]:
    """(connect, read) timeouts of one data-path attempt: `max_attempts` of them fit in the deadline."""
    per_try = deadline_s / max(1, settings.max_attempts)
    return min(settings.connect_timeout_s, per_try), min(settings.read_timeout_s, per_try)


def make_client(settings: TierSettings, pool_connections: int, *, session: Any = None,
                timeouts: tuple[float, float] | None = None) -> tuple[Any, Any]:
    """A boto3 S3 client with bounded timeouts and retries and the tier's operator options.

    Checksums are computed only when an operation requires them: several S3-compatible stores
    (older ONTAP S3, MinIO) reject boto3's default CRC headers, and records carry their own CRCs.
    """
    style = settings.addressing_style or ("path" if settings.endpoint_url else None)
    connect_s, read_s = timeouts or (settings.connect_timeout_s, settings.read_timeout_s)
    cfg = Config(
        connect_timeout=connect_s,
        read_timeout=read_s,
        retries={"total_max_attempts": settings.max_attempts, "mode": settings.retry_mode},
        max_pool_connections=pool_connections,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        user_agent_extra="lifeboat-cache",
        s3={"addressing_style": style} if style else None,
    )
    session = session or make_session(settings)
    verify: bool | str = str(settings.ca_bundle) if settings.ca_bundle and settings.verify else settings.verify
    client = session.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=cfg,
                            verify=verify)
    return session, client


def put_options(settings: TierSettings) -> dict[str, str]:
    """Extra PutObject arguments every PUT of the tier carries: encryption and storage class."""
    extra: dict[str, str] = {}
    if settings.sse:
        extra["ServerSideEncryption"] = settings.sse
    if settings.sse_kms_key_id:
        extra["SSEKMSKeyId"] = settings.sse_kms_key_id
    if settings.storage_class:
        extra["StorageClass"] = settings.storage_class
    return extra


class S3Client:
    """One bucket's requests, counted in `counters` (`<op>_requests`, `bytes_read`).

    `data` is the data path's boto3 client, `background` the one with the configured timeouts (the
    same object when a client was passed in). `name` is the tier's name, for log lines only.
    """

    def __init__(self, bucket: str, data: Any, background: Any, counters: Counters, *, name: str,
                 session: Any = None, put_extra: dict[str, str] | None = None) -> None:
        self.bucket = bucket
        self.data = data
        self.background = background
        self.counters = counters
        self.name = name
        self.session = session
        self.put_extra = dict(put_extra or {})
        self.list_page_keys = LIST_PAGE_KEYS
        self._multi_delete = True
        self._secrets = self._credential_strings()

    @classmethod
    def connect(cls, settings: TierSettings, pool_connections: int, deadline_s: float, counters: Counters, *,
                name: str, client: Any = None) -> "S3Client":
        """The tier's two clients on one session; or `client` for both (tests pass one in)."""
        session, background = None, client
        if client is None:
            session, client = make_client(settings, pool_connections,
                                          timeouts=data_path_timeouts(settings, deadline_s))
            _, background = make_client(settings, pool_connections, session=session)
        return cls(settings.bucket or "", client, background, counters, name=name, session=session,
                   put_extra=put_options(settings))

    # ------------------------------------------------------------------ errors
    def _credential_strings(self) -> list[str]:
        """The resolved credential strings, only to scrub them from error messages."""
        try:
            creds = self.session.get_credentials() if self.session is not None else None
            frozen = creds.get_frozen_credentials() if creds is not None else None
        except Exception:
            return []
        if frozen is None:
            return []
        return [s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s and len(s) >= 4]

    def scrub(self, text: str) -> str:
        """`text` with every resolved credential string replaced by `***`."""
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _error(self, e: Exception, what: str, strip: bool = True) -> S3Error:
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            text = f"{what}: {code} {err.get('Message') or ''}"
            return S3Error(code, self.scrub(text.strip() if strip else text))
        # transport: timeouts, refused connections, closed streams
        return S3Error("", self.scrub(f"{what}: {type(e).__name__}: {e}"))

    # ------------------------------------------------------------------ requests
    def call(self, op: str, background: bool = False, **kw: Any) -> Any:
        """One boto3 request `op` (its own retries and timeouts); any failure raises S3Error."""
        self.counters.add(f"{op}_requests")
        try:
            return getattr(self.background if background else self.data, op)(**kw)
        except Exception as e:
            raise self._error(e, f"s3 {op}") from None

    def list(self, prefix: str, start_after: str | None = None) -> dict[str, int]:
        """name (relative to prefix) -> size, for every object under prefix (paginated)."""
        out: dict[str, int] = {}
        for page in self.list_pages(prefix, start_after):
            out.update(page)
        return out

    def list_pages(self, prefix: str, start_after: str | None = None) -> Iterator[dict[str, int]]:
        """One dict (name relative to prefix -> size) per ListObjectsV2 page (background client)."""
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                              "MaxKeys": min(FIRST_LIST_PAGE_KEYS, self.list_page_keys)}
        if start_after:
            kw["StartAfter"] = prefix + start_after
        while True:
            resp = self.call("list_objects_v2", background=True, **kw)
            yield {o["Key"][len(prefix):]: int(o["Size"]) for o in resp.get("Contents", ())}
            if not resp.get("IsTruncated") or not resp.get("NextContinuationToken"):
                return
            kw["ContinuationToken"] = resp["NextContinuationToken"]
            kw["MaxKeys"] = self.list_page_keys

    def get_range(self, key: str, first: int, last: int, background: bool = False, *,
                  label: str | None = None) -> bytes:
        """Bytes first..last (inclusive) of one object; `label` names it in error messages (default: key)."""
        client = self.background if background else self.data
        try:
            resp = client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{last}")
            data = resp["Body"].read()
        except Exception as e:
            raise self._error(e, f"s3 get {label if label is not None else key}", strip=False) from None
        finally:
            self.counters.add("get_object_requests")
        self.counters.add("bytes_read", len(data))
        return data

    def put(self, key: str, body: bytes, background: bool = False) -> None:
        """One PutObject, with the tier's encryption and storage-class options."""
        try:
            self.call("put_object", background=background, Bucket=self.bucket, Key=key, Body=body, **self.put_extra)
        except S3Error as e:
            if e.code not in REFUSED_OPTION_CODES or not self.put_extra:
                raise
            opts = ", ".join(f"{PUT_OPTION_NAMES[k]}: {v}" for k, v in self.put_extra.items())
            raise S3Error(e.code, f"{e.strerror} (this tier sets {opts} and the server refused the PUT: remove "
                                  f"them from the tier in lifeboat.yaml, or set the server up for them; Ceph RGW "
                                  f"needs HTTPS and a KMS for sse, and knows only the storage classes of its "
                                  f"placement: docs/storage.md, 'Ceph RGW')") from None

    def delete(self, keys: list[str]) -> set[str]:
        """Delete keys (DeleteObjects, or one DeleteObject each where refused); returns keys not deleted."""
        if self._multi_delete:
            try:
                resp = self.call("delete_objects", background=True, Bucket=self.bucket,
                                 Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
                return {e.get("Key") for e in resp.get("Errors", ())}
            except S3Error as e:
                if e.code not in NO_MULTI_DELETE_CODES:
                    raise
                self._multi_delete = False
                log.warning("lifeboat: %s refuses DeleteObjects (%s); deleting one object per request", self.name,
                            e.code)
        failed: set[str] = set()
        for k in keys:
            try:
                self.call("delete_object", background=True, Bucket=self.bucket, Key=k)
            except S3Error as e:
                if e.code not in STALE_CODES:
                    failed.add(k)
        return failed

    def close(self) -> None:
        for client in {id(self.data): self.data, id(self.background): self.background}.values():
            close = getattr(client, "close", None)
            if close is not None:
                close()
