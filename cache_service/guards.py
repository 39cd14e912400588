"""What an embedding misses: the checks a semantic cache hit must also pass.

Two prompts whose embeddings are nearly the same can still ask different things: "5 km" and
"50 km", "with garlic" and "without garlic", "Python" and "Rust", "Fahrenheit to Celsius" and
"Celsius to Fahrenheit" reach cosine 0.95-0.99 with all-MiniLM-L6-v2 (docs/notes). So a hit also
needs the two prompts to agree, word for word, on what such words say. ``differs(a, b)`` returns
the first guard that tells them apart ("" when none does):

- ``number``: the same numbers (digits or number words), as a multiset;
- ``negation``: as many negations (not, no, never, without, n't, ...);
- ``quoted``: the same quoted or back-ticked text;
- ``script`` / ``language``: the same writing system and, in Latin script, the same language;
- ``entity``: a name in one (a capitalised word not opening a sentence, an acronym, a word
  with digits or inner capitals) appears in the other;
- ``lexicon``: no word of the kinds that change an answer while embeddings barely move (units,
  languages, programming languages and tools, formats, times and dates, quantities and scope,
  polar words: ascending/descending, before/after, pros/cons, ...) is in one prompt only;
- ``opposite``: no word of one prompt is the opposite of a word of the other (singly / doubly,
  ascending / descending, hyper- / hypothyroidism, mute / unmute): WordNet's antonyms and the
  prefix swaps learned from them (``data/antonyms.txt``, written by ``meshserve.commands.antonyms``);
- ``order``: a connector both use (to, into, from, than, versus) is followed by the same word
  in each ("decimal to binary" is not "binary to decimal").

Words that differ only by a one-letter typo (``revese``/``reverse``) count as the same. The
checks are deliberately strict: a refused paraphrase costs one generation, a false hit serves a
wrong answer.

``difference(a, b)`` says how two prompts' content words (those left once the words that frame a
request, "how do I", "what is the best way to", "please", are set aside) differ: not at all
(``same``: another order, other function words, typos, inflections, "home made" / "homemade"),
by words only one has (``added``), or by a word of each that the other lacks (``swapped``: "boil"
/ "poach"). The matcher asks a higher similarity of the latter two (``cache_service.matcher``).
The rules are measured on ``tests/data/semantic_eval_*.jsonl`` (the tuning half to choose, the
test half to report).
"""

from __future__ import annotations

import importlib.resources
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterator
from functools import lru_cache

# Words, keeping what names programming languages: c++, c#, node.js, don't; "%" is a word.
_WORD = re.compile(r"[^\W_]+(?:[+#]+|(?:['’.][^\W_]+)*)|%", re.UNICODE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_QUOTED = re.compile(r"(?<!\w)'([^']+)'(?!\w)|\"([^\"]+)\"|`([^`]+)`|“([^”]+)”")
_SENTENCE_END = re.compile(r"[.!?:;]\s*$")

NUMBER_WORDS = {
    w: i for i, w in enumerate(
        "zero - two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
     "hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "dozen": 12, "half": 0.5,
     "quarter": 0.25, "double": 2, "triple": 3, "twice": 2}
# "one" is left out ("rent one", "quick one"); as a quantity it is in LEXICON.

NEGATIONS = frozenset(
    "not no never none nothing nobody nowhere neither nor without cannot can't won't don't doesn't "
    "didn't isn't aren't wasn't weren't shouldn't wouldn't couldn't haven't hasn't hadn't mustn't "
    "needn't shan't ain't non lack lacking".split()
)

_LEXICON = """
mm cm centimeter centimetre meter metre km kilometer kilometre inch inches feet foot ft yard mile
miles mph kph knot nautical gram kilogram kg lb lbs pound ounce oz ton tonne stone milligram mg liter
litre ml milliliter gallon quart pint cup tablespoon teaspoon tbsp tsp celsius fahrenheit kelvin
degree calorie kcal joule watt kilowatt kwh volt amp hertz hz ghz mhz byte kilobyte megabyte gigabyte
terabyte petabyte kb mb gb tb bit acre hectare second minute hour day week fortnight month year decade
century millennium percent dollar usd euro eur yen gbp rupee yuan peso franc bitcoin
english french german spanish italian portuguese dutch russian chinese mandarin cantonese japanese
korean arabic hindi bengali urdu turkish greek latin hebrew polish swedish norwegian danish finnish
czech hungarian romanian ukrainian thai vietnamese indonesian malay swahili persian farsi tagalog
python javascript typescript java kotlin swift rust go golang ruby php perl scala haskell elixir
erlang clojure lua julia matlab fortran cobol pascal bash shell powershell sql mysql postgresql postgres
sqlite mongodb redis c c++ c# csharp .net dart r objective-c assembly wasm react vue angular svelte
django flask fastapi rails spring node node.js nodejs express pandas numpy pytorch tensorflow excel
linux windows macos mac ios android ubuntu debian docker kubernetes aws azure gcp git
json yaml yml xml csv tsv html css markdown latex pdf toml ini table bullet bulleted numbered
paragraph essay sentence word tweet email letter memo poem haiku limerick sonnet song story summary
outline chart diagram slide pseudocode formal casual informal friendly professional funny serious
short long brief detailed concise
today tomorrow yesterday tonight morning afternoon evening night noon midnight dawn dusk weekday
weekend monday tuesday wednesday thursday friday saturday sunday january february march april may
june july august september october november december spring summer autumn fall winter breakfast
lunch dinner brunch christmas eve easter daily weekly monthly yearly annual annually hourly now
current latest past future next previous last first recent early late earlier later
one all some any few several least less fewer only both either entire whole full partial single
multiple other alternate odd even common rare rarely often always sometimes usually seldom typical
unusual mild severe serious
ascending descending increase decrease rise raise fall drop lower higher low down out off before
after above below under inside outside top bottom left right north south east west upper forward
backward min max minimum maximum largest smallest biggest tiniest longest shortest tallest highest
lowest fastest slowest worst worse hottest coldest hotter colder warmer cooler oldest newest older
newer younger heavier lighter heaviest lightest cheaper cheapest expensive cheap faster slower larger
smaller bigger closer farther further closest farthest furthest easiest hardest easier harder cons
disadvantage drawback risk upload download import export encrypt decrypt encode decode compress
decompress zip unzip upgrade downgrade install uninstall insert delete enable disable allow block buy
sell borrow lend send receive push pull win lose gain lost won accept reject include exclude shorten
lengthen shrink expand grow widen narrow male female men women boy girl adult child children kid baby
"""
# Words that name a unit whatever their prefix: kilowatt-hour, nanoseconds, megabytes.
UNIT_ROOTS = ("byte", "meter", "metre", "gram", "liter", "litre", "watt", "joule", "second", "hertz", "volt")

# A connector and the next word that is not filler: "convert X to Y" keeps (to, y).
CONNECTORS = frozenset("to into from than versus vs".split())
SPAN = 3  # words looked at on either side of a connector for the swap of two marked words
_FILLER = frozenset("a an the my your our their this that these those its his her some".split())

# Common function words of the Latin-script languages told apart by the `language` guard.
_STOPWORDS = {
    "en": ("the is are was were what how do does did a an of to in for and you can i my me with which who "
           "whom why by it this that be have has on at from or should would could will there".split()),
    "fr": "le la les est un une des du de et que qui comment pourquoi quel quelle je vous pour avec".split(),
    "de": "der die das ist ein eine und wie was warum ich sie mit für nicht auf zu den dem".split(),
    "es": "el la los las es un una y que cómo qué por para con de en mi yo usted dónde".split(),
    "it": "il lo la gli le è un una e che come perché per con di in mi io qual".split(),
    "pt": "o a os as é um uma e que como por para com de em eu você onde qual".split(),
    "nl": "de het een is en hoe wat waarom ik je met voor van op niet".split(),
}


# Spellings of one word: unit abbreviations and symbols, and "every" (= all, for comparison).
SYNONYMS = {
    "%": "percent", "km": "kilometer", "kms": "kilometer", "kg": "kilogram", "kgs": "kilogram",
    "lb": "pound", "lbs": "pound", "mi": "mile", "ft": "foot", "feet": "foot", "oz": "ounce",
    "ml": "milliliter", "cm": "centimeter", "mm": "millimeter", "hr": "hour", "hrs": "hour",
    "min": "minute", "mins": "minute", "sec": "second", "secs": "second", "every": "all",
    "metre": "meter", "metres": "meter", "litre": "liter", "litres": "liter", "kilometre": "kilometer",
    "kilometres": "kilometer",
}


def _words(text: str) -> list[str]:
    words = (w.lower().replace("’", "'") for w in _WORD.findall(text))
    return [SYNONYMS.get(w, w) for w in words]


def _stem(word: str) -> str:
    """Crude singular: enough to match 'recipe'/'recipes' and to look plurals up in the lexicon."""
    if word.endswith("'s"):
        return word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    return word


# Words and their crude singulars ("cons" -> "con"), as prompts' words are compared.
LEXICON = frozenset(w for word in _LEXICON.split() for w in (word, _stem(word)))


def _marked(word: str) -> bool:
    """A word of LEXICON (or a unit), or a hyphenated word with one among its parts."""
    return any(
        _stem(part) in LEXICON or part in LEXICON or _stem(part).endswith(UNIT_ROOTS)
        for part in {word, *word.split("-")} if part
    )


def _numbers(text: str, words: list[str]) -> Counter[str]:
    """Digits as written (without thousands commas) and number words as digits."""
    found: Counter[str] = Counter(m.replace(",", "") for m in _NUMBER.findall(text))
    for w in words:
        for part in w.split("-"):
            if part in NUMBER_WORDS:
                found[f"{NUMBER_WORDS[part]:g}"] += 1
    return found


def _negations(words: list[str]) -> int:
    return sum(1 for w in words if w in NEGATIONS or w.endswith("n't"))


def _quoted(text: str) -> set[str]:
    return {next(g for g in m if g).strip().lower() for m in _QUOTED.findall(text)}


def _script(text: str) -> str:
    """The writing system most letters of ``text`` use."""
    counts: Counter[str] = Counter()
    for ch in text:
        if ch.isalpha():
            name = unicodedata.name(ch, "")
            counts[name.split(" ")[0] if name else "?"] += 1
    if not counts:
        return ""
    script = counts.most_common(1)[0][0]
    return "CJK" if script in ("CJK", "HIRAGANA", "KATAKANA", "HANGUL") else script


def _latin_language(words: list[str]) -> str:
    """The language whose function words ``words`` use most ("" when none or a tie)."""
    scores = Counter({lang: sum(1 for w in words if w in stop) for lang, stop in _STOPWORDS.items()})
    (best, top), *rest = scores.most_common()
    return best if top and (not rest or rest[0][1] < top) else ""


def _entities(text: str) -> set[str]:
    """Names: capitalised words not opening a sentence, acronyms, words with digits or inner
    capitals (iPhone, S3, GPT-4). Lowercased."""
    names: set[str] = set()
    letters = [ch for ch in text if ch.isalpha()]
    if letters and sum(ch.isupper() for ch in letters) > len(letters) / 2:
        return names  # SHOUTED TEXT: capitals say nothing about names
    prev_end = 0
    for m in _WORD.finditer(text):
        word = m.group(0)
        opens_sentence = prev_end == 0 or bool(_SENTENCE_END.search(text[:m.start()]))
        prev_end = m.end()
        if word in ("I", "I'm", "I've", "I'd", "I'll") or not any(ch.isalpha() for ch in word):
            continue
        inner_caps = any(ch.isupper() for ch in word[1:]) and not word.isupper()
        acronym = word.isupper() and len(word) >= 2
        has_digit = any(ch.isdigit() for ch in word)
        capitalised = word[0].isupper() and not opens_sentence
        if inner_caps or acronym or has_digit or capitalised:
            names.add(word.lower())
    return names


def _close(a: str, b: str) -> bool:
    """One edit (or one swap of neighbours) apart, both at least 4 letters: a typo."""
    if min(len(a), len(b)) < 4 or abs(len(a) - len(b)) > 1 or a == b:
        return a == b
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _unmatched(mine: set[str], theirs: set[str]) -> set[str]:
    """My words the other prompt lacks, typos and synonyms of its words forgiven."""
    return {w for w in mine - theirs if not any(_close(w, t) for t in theirs - mine) and not _synonyms(w) & theirs}


@lru_cache(maxsize=1)
def _synonym_table() -> dict[str, frozenset[str]]:
    """Each word's synonyms: the other single words of its WordNet synsets (``data/synonyms.txt``)."""
    text = importlib.resources.files(__package__).joinpath("data", "synonyms.txt").read_text()
    table: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            words = [sys.intern(w) for w in line.split()]  # one string per word, however many groups
            for w in words:
                table.setdefault(w, set()).update(words)
    return {w: frozenset(s - {w}) for w, s in table.items()}


def _synonyms(word: str) -> frozenset[str]:
    """A word's synonyms; none for a marked word (a unit, a time, a scope...): there a word of
    nearly the same meaning is the near miss ("seconds" / "minutes" share a WordNet synset)."""
    if _marked(word):
        return frozenset()
    table = _synonym_table()
    return table.get(word) or table.get(_stem(word), frozenset())


@lru_cache(maxsize=1)
def _antonyms() -> tuple[dict[str, frozenset[str]], tuple[tuple[str, str], ...]]:
    """Each word's opposites and the prefix swaps that make opposites (both ways), from the list
    ``meshserve.commands.antonyms`` writes (read once per process)."""
    text = importlib.resources.files(__package__).joinpath("data", "antonyms.txt").read_text()
    opposites: dict[str, set[str]] = {}
    swaps: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        fields = [sys.intern(f) for f in line.split()]
        if fields[0] == "prefix:":
            x, y = ("" if f == "-" else f for f in fields[1:])
            swaps += [(x, y), (y, x)]
        else:
            x, y = fields
            opposites.setdefault(x, set()).add(y)
            opposites.setdefault(y, set()).add(x)
    return {w: frozenset(o) for w, o in opposites.items()}, tuple(swaps)


# Endings that make an inflected form, and what the plain word ends with instead:
# fastest -> fast, larger -> large, heavier -> heavy, sorted -> sort, biggest -> big.
_INFLECTIONS = (("iest", "y"), ("ier", "y"), ("est", ""), ("est", "e"), ("er", ""), ("er", "e"),
                ("ily", "y"), ("ly", ""), ("ed", ""), ("ed", "e"), ("ing", ""), ("ing", "e"), ("s", ""))


def _forms(word: str) -> Iterator[str]:
    """``word`` and the plain words it may be an inflection of (some are not words: harmless,
    they are only looked up)."""
    yield word
    for ending, plain in _INFLECTIONS:
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            base = word[:-len(ending)] + plain
            yield base
            if not plain and base[-1] == base[-2]:
                yield base[:-1]


def _opposite(only_a: set[str], only_b: set[str]) -> bool:
    """Whether a word only ``a`` has is the opposite of a word only ``b`` has."""
    opposites, swaps = _antonyms()
    forms_b = {f for w in only_b for f in _forms(w)}
    for form in (f for w in only_a for f in _forms(w)):
        if opposites.get(form, frozenset()) & forms_b:
            return True
        if any(form.startswith(x) and len(form) - len(x) >= 3 and y + form[len(x):] in forms_b for x, y in swaps):
            return True
    return False


SAME, ADDED, SWAPPED = "same", "added", "swapped"

# Words that frame a request rather than say what it asks: function words, the generic question
# words (what, how: not why, when, where, who, which, which ask for a kind of answer), and the
# words of asking, explaining and politeness, and the nouns a search-box query puts for "how do I"
# ("guacamole recipe", "git tutorial"). Chosen as English grammar has them, not from pairs.
_FRAME = """
a an the my your our their this that these those its his her some i me you we it they them is are
was were be been being am do does did doing done can could would should will shall may might must
have has had having how what whats to of in on at for with by from about into as and or but if so
then there here just please hey hi hello thanks thank quick question tell know want need like
help explain describe define definition meaning mean means way ways method steps step tips tip
best good right easiest simplest quickest proper correct get make go give use using something
anyone someone really also im i'd i've you're thing things happen happens cause causes reason
recipe tutorial guide instructions example examples
"""
FRAME_WORDS = frozenset(w for word in _FRAME.split() for w in (word, _stem(word)))


def _related(x: str, y: str) -> bool:
    """The same word, a typo of it, or another form of it (remove / removal, grow / growth):
    one starts with all of the other but its last two letters, at least four letters."""
    if x == y or _close(x, y):
        return True
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n >= 4 and n >= min(len(x), len(y)) - 2


def _content(words: list[str]) -> list[str]:
    return [s for w in words if (s := _stem(w)) not in FRAME_WORDS and w not in FRAME_WORDS]


def _unexplained(mine: list[str], theirs: list[str]) -> set[str]:
    """My content words that no word of the other prompt is (related to), nor two of its words
    written together (homemade / home made)."""
    joined = {x + y for x, y in zip(theirs, theirs[1:], strict=False)}
    return {w for w in mine if w not in joined and not any(_related(w, t) for t in theirs)
            and not _synonyms(w) & set(theirs)}


def difference(a: str, b: str) -> str:
    """SAME, ADDED or SWAPPED: how the content words of prompts ``a`` and ``b`` differ."""
    content_a, content_b = _content(_profile(a)[0]), _content(_profile(b)[0])
    only_a, only_b = _unexplained(content_a, content_b), _unexplained(content_b, content_a)
    if only_a and only_b:
        return SWAPPED
    return ADDED if only_a or only_b else SAME


def _followers(words: list[str]) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for i, w in enumerate(words):
        if w in CONNECTORS:
            nxt = next((x for x in words[i + 1:] if x not in _FILLER), "")
            pairs.add((w, _stem(nxt)))
    return pairs


def _framing(words: list[str]) -> set[str]:
    """Words that only frame a request: the one before "way", "ways" or "tips" ("the fastest
    way to", "any tips on", "some ways to")."""
    return {_stem(w) for w, nxt in zip(words, words[1:], strict=False) if nxt in ("way", "ways", "tips", "tip")}


def _spans(words: list[str], names: set[str]) -> set[tuple[str, str, str]]:
    """(x, connector, y): a name, number or marked word x, then within SPAN words a connector (or
    "in"), then within SPAN words another such word y ("celsius", "in", "fahrenheit")."""
    marked = [w in names or _marked(w) or any(ch.isdigit() for ch in w) for w in words]
    spans = set()
    for i, word in enumerate(words):
        if word in CONNECTORS or word == "in":
            before = [words[j] for j in range(max(0, i - SPAN), i) if marked[j]]
            after = [words[j] for j in range(i + 1, min(len(words), i + 1 + SPAN)) if marked[j]]
            if before and after:
                spans.add((before[-1], word, after[0]))
    return spans


@lru_cache(maxsize=4096)
def _profile(text: str) -> tuple:
    words = _words(text)
    return (words, _numbers(text, words), _negations(words), _quoted(text), _script(text), _entities(text))


def differs(a: str, b: str) -> str:
    """The first guard that tells prompts ``a`` and ``b`` apart, or "" if none does."""
    return next(telling(a, b), "")


def telling(a: str, b: str) -> Iterator[str]:
    """The guards that tell prompts ``a`` and ``b`` apart, in the order of the module's list."""
    words_a, numbers_a, neg_a, quoted_a, script_a, names_a = _profile(a)
    words_b, numbers_b, neg_b, quoted_b, script_b, names_b = _profile(b)
    if numbers_a != numbers_b:
        yield "number"
    if neg_a != neg_b:
        yield "negation"
    # Quoted text must be in the other prompt too (quoted or not: 'cactus' and cactus agree).
    if any(q not in b.lower() for q in quoted_a) or any(q not in a.lower() for q in quoted_b):
        yield "quoted"
    if script_a != script_b:
        yield "script"
    if script_a == "LATIN":
        lang_a, lang_b = _latin_language(words_a), _latin_language(words_b)
        if lang_a and lang_b and lang_a != lang_b:
            yield "language"
    set_a = {_stem(w) for w in words_a}
    set_b = {_stem(w) for w in words_b}
    only_a, only_b = _unmatched(set_a, set_b), _unmatched(set_b, set_a)
    if any(_stem(n) in only_a for n in names_a) or any(_stem(n) in only_b for n in names_b):
        yield "entity"
    if _opposite(only_a, only_b):
        yield "opposite"
    framing = _framing(words_a) | _framing(words_b)
    if any(_marked(w) for w in (only_a | only_b) - framing):
        yield "lexicon"
    # A connector both use must lead to the same words in each, one side's a subset of the
    # other's (an extra "to" of an infinitive is no contradiction; "X to Y" / "Y to X" is).
    fa, fb = _followers(words_a), _followers(words_b)
    crossed = False
    for connector in {c for c, _ in fa} & {c for c, _ in fb}:
        after_a = {w for c, w in fa if c == connector}
        after_b = {w for c, w in fb if c == connector}
        crossed = crossed or not (after_a <= after_b or after_b <= after_a)
    # Two names, numbers or marked words on either side of a connector, the other way round in
    # the other prompt: "30 Celsius in Fahrenheit" / "30 Fahrenheit in Celsius", "port 8080 to
    # port 80" / "port 80 to port 8080".
    spans_b = _spans(words_b, names_b)
    if crossed or any((y, c, x) in spans_b for x, c, y in _spans(words_a, names_a)):
        yield "order"
