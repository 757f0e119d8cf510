"""Public-domain text for the returning-user demo, tests and benchmark (shipped as code, no data files).

The Declaration of Independence (1776, opening and the first grievances) and the Gettysburg Address
(1863, Bliss copy): both in the public domain. Long enough that recomputing its prefix is visibly
slower than reading it back.
"""

from __future__ import annotations

DECLARATION = """\
IN CONGRESS, July 4, 1776.

The unanimous Declaration of the thirteen united States of America.

When in the Course of human events, it becomes necessary for one people to dissolve the political \
bands which have connected them with another, and to assume among the powers of the earth, the \
separate and equal station to which the Laws of Nature and of Nature's God entitle them, a decent \
respect to the opinions of mankind requires that they should declare the causes which impel them to \
the separation.

We hold these truths to be self-evident, that all men are created equal, that they are endowed by \
their Creator with certain unalienable Rights, that among these are Life, Liberty and the pursuit of \
Happiness. That to secure these rights, Governments are instituted among Men, deriving their just \
powers from the consent of the governed, That whenever any Form of Government becomes destructive of \
these ends, it is the Right of the People to alter or to abolish it, and to institute new Government, \
laying its foundation on such principles and organizing its powers in such form, as to them shall \
seem most likely to effect their Safety and Happiness. Prudence, indeed, will dictate that Governments \
long established should not be changed for light and transient causes; and accordingly all experience \
hath shewn, that mankind are more disposed to suffer, while evils are sufferable, than to right \
themselves by abolishing the forms to which they are accustomed. But when a long train of abuses and \
usurpations, pursuing invariably the same Object evinces a design to reduce them under absolute \
Despotism, it is their right, it is their duty, to throw off such Government, and to provide new \
Guards for their future security. Such has been the patient sufferance of these Colonies; and such is \
now the necessity which constrains them to alter their former Systems of Government. The history of \
the present King of Great Britain is a history of repeated injuries and usurpations, all having in \
direct object the establishment of an absolute Tyranny over these States. To prove this, let Facts be \
submitted to a candid world.

He has refused his Assent to Laws, the most wholesome and necessary for the public good.

He has forbidden his Governors to pass Laws of immediate and pressing importance, unless suspended in \
their operation till his Assent should be obtained; and when so suspended, he has utterly neglected \
to attend to them.

He has refused to pass other Laws for the accommodation of large districts of people, unless those \
people would relinquish the right of Representation in the Legislature, a right inestimable to them \
and formidable to tyrants only.

He has called together legislative bodies at places unusual, uncomfortable, and distant from the \
depository of their public Records, for the sole purpose of fatiguing them into compliance with his \
measures.

He has dissolved Representative Houses repeatedly, for opposing with manly firmness his invasions on \
the rights of the people.

He has refused for a long time, after such dissolutions, to cause others to be elected; whereby the \
Legislative powers, incapable of Annihilation, have returned to the People at large for their \
exercise; the State remaining in the mean time exposed to all the dangers of invasion from without, \
and convulsions within.

He has endeavoured to prevent the population of these States; for that purpose obstructing the Laws \
for Naturalization of Foreigners; refusing to pass others to encourage their migrations hither, and \
raising the conditions of new Appropriations of Lands.

He has obstructed the Administration of Justice, by refusing his Assent to Laws for establishing \
Judiciary powers.

He has made Judges dependent on his Will alone, for the tenure of their offices, and the amount and \
payment of their salaries.

He has erected a multitude of New Offices, and sent hither swarms of Officers to harrass our people, \
and eat out their substance.
"""

GETTYSBURG = """\
Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived \
in Liberty, and dedicated to the proposition that all men are created equal.

Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived and \
so dedicated, can long endure. We are met on a great battle-field of that war. We have come to \
dedicate a portion of that field, as a final resting place for those who here gave their lives that \
that nation might live. It is altogether fitting and proper that we should do this.

But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this \
ground. The brave men, living and dead, who struggled here, have consecrated it, far above our poor \
power to add or detract. The world will little note, nor long remember what we say here, but it can \
never forget what they did here. It is for us the living, rather, to be dedicated here to the \
unfinished work which they who fought here have thus far so nobly advanced. It is rather for us to be \
here dedicated to the great task remaining before us -- that from these honored dead we take \
increased devotion to that cause for which they gave the last full measure of devotion -- that we \
here highly resolve that these dead shall not have died in vain -- that this nation, under God, shall \
have a new birth of freedom -- and that government of the people, by the people, for the people, \
shall not perish from the earth.

Abraham Lincoln
November 19, 1863
"""

QUESTION = "In two sentences: what do these two documents have in common?"


def returning_user_messages() -> list[dict[str, str]]:
    """The demo's chat: both documents, then the question (the same every visit)."""
    return [{"role": "user", "content": f"{DECLARATION}\n\n{GETTYSBURG}\n\n{QUESTION}"}]


def other_user_messages() -> list[dict[str, str]]:
    """A different prompt of similar length (a negative control: it must get nothing from the store)."""
    return [{"role": "user", "content": f"{GETTYSBURG}\n\n{DECLARATION}\n\nSummarize the first document."}]
