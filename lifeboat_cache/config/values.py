"""Values of lifeboat.yaml and of the environment: ConfigError and the parsers of one value each.

Sizes (500GiB), ages (7d), permission modes, bounded numbers, switches, choices and strings. Each
parser takes `where` (the YAML path or variable) and raises ConfigError naming it, the value and the
fix, because the message is often all a user sees. Kept apart from the Settings types and from the
parsing of a whole document (`load.py`, `storage.py`), which both build on these.

Core layer: imports nothing of the package.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Mapping

MAX_SIZE_BYTES = 1 << 60  # 1 EiB: any larger size is a typo, and would overflow 64-bit offsets
_MAX_NUMBER_CHARS = 64  # longer numerals are typos (and int() refuses > 4300 digits)


class ConfigError(ValueError):
    """A setting is invalid; the message names the key (YAML path or env var) and the fix."""


# ASCII only: "²" or "٣" are not numbers in a config file (str.isdigit() would say they are)
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE | re.ASCII)
_INT_RE = re.compile(r"^\s*[+-]?[0-9]+\s*$", re.ASCII)


def show_value(value: Any, limit: int = 80) -> str:
    """repr() for error messages that cannot itself fail (huge ints) or flood the log."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int of more than 4300 digits
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50,
}


def format_size(n: float, digits: int | None = None) -> str:
    """Bytes as text in binary units, the other way from parse_size: 512 B, 45 KiB, 1.4 GiB.

    `digits` decimals after the unit's number; by default one below 10 of a unit (when not whole)
    and none above, for log lines (256 MiB). Raises nothing."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    if digits is None:
        digits = 1 if value < 10 and value != int(value) else 0
    return f"{value:.{digits}f} {unit}"


def parse_size(value: Any, where: str) -> int:
    """'500GiB', '1.5TB', '64MiB' or an int (bytes) -> bytes, at most MAX_SIZE_BYTES."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a size such as 500GiB or 64MiB, got {show_value(value)}")
    n: int | None = None
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"{where}: must be > 0 bytes, got {show_value(value)}")
        n = value
    elif isinstance(value, str) and len(value) <= _MAX_NUMBER_CHARS:
        m = _SIZE_RE.match(value)
        if m and (m.group(2) or "").upper() in _SIZE_UNITS:
            # exact decimal arithmetic: float() would overflow or round "1.1TB"
            n = int(Fraction(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()])
            if n <= 0:
                n = None
    if n is None:
        raise ConfigError(f"{where}: expected a size such as 500GiB, 2TB or 64MiB, got {show_value(value)}")
    if n > MAX_SIZE_BYTES:
        raise ConfigError(f"{where}: {show_value(value)} is larger than the 1 EiB limit; give a size such as 500GiB")
    return n


def parse_mode(value: Any, where: str, top: int, need: int) -> int:
    """A permission mode: an int (YAML 0640 / 0o640) or an octal string ("0640"); the owner's bits `need` kept."""
    if isinstance(value, str) and re.fullmatch(r"\s*(0o?)?[0-7]{1,4}\s*", value):
        value = int(value.strip().removeprefix("0o") or "0", 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top or value & need != need:
        raise ConfigError(f"{where}: expected an octal mode such as \"{need | 0o040:04o}\" (owner bits {need:#o} "
                          f"required, at most {top:#o}, no setuid/sticky bits), got {value!r}")
    return value


def parse_int(value: Any, where: str, lo: int, hi: int) -> int:
    """An integer (or a numeral string) in lo .. hi; never a bool, never a numeral too long to be real."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and len(value) <= _MAX_NUMBER_CHARS and _INT_RE.match(value):
            value = int(value)
        else:
            raise ConfigError(f"{where}: expected an integer between {lo} and {hi}, got {show_value(value)}")
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: must be between {lo} and {hi}, got {show_value(value)}")
    return value


def parse_float(value: Any, where: str, lo: float, hi: float) -> float:
    """A number (int, float or ASCII numeral string) in lo .. hi; nan and bools are refused."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if isinstance(value, str) and (len(value) > _MAX_NUMBER_CHARS or not value.isascii()):
            raise ValueError
        f = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond 1e308
        raise ConfigError(f"{where}: expected a number between {lo} and {hi}, got {show_value(value)}") from None
    if not lo <= f <= hi:  # also rejects nan
        raise ConfigError(f"{where}: must be between {lo} and {hi}, got {show_value(value)}")
    return f


def parse_bool(value: Any, where: str) -> bool:
    """true / false, 1 / 0, yes / no, on / off (YAML writes them all)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # no str(): a huge int cannot be printed
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{where}: expected true or false, got {show_value(value)}")


def parse_choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, exactly (case included)."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}; got {show_value(value)}")
    return value


def parse_str(value: Any, where: str) -> str:
    """A non-empty string with no NUL and no unpaired surrogate (it may become a path or a header)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {show_value(value)}")
    if "\0" in value or not is_encodable(value):
        raise ConfigError(f"{where}: {show_value(value)} contains a NUL or an unpaired surrogate; use plain text")
    return value


def is_encodable(value: str) -> bool:
    """False for a string UTF-8 cannot encode (a lone surrogate), which no file name or key may hold."""
    try:
        value.encode()
        return True
    except UnicodeEncodeError:  # lone surrogates, e.g. from a YAML "\ud800" escape
        return False


def check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """ConfigError listing unknown keys and the allowed ones: a typo must not fall back to a default."""
    unknown = sorted((show_value(k, 40) if not isinstance(k, str) else k for k in set(obj) - allowed))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys are {', '.join(sorted(allowed))}"
        )


AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(value: Any, where: str) -> float:
    """'90s', '30m', '24h', '7d', '2w' or a number of seconds -> seconds (> 0)."""
    text = str(value).strip().lower() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
    try:
        v = float(text[:-1]) * AGE_UNITS[text[-1]] if text[-1:] in AGE_UNITS else float(text)
    except ValueError:
        v = -1.0
    if not v > 0 or v != v or v == float("inf"):
        raise ConfigError(f"{where}: expected an age such as 90s, 30m, 24h or 7d, got {show_value(value)}")
    return v


