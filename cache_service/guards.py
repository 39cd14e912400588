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
- ``order``: a connector both use (to, into, from, than, versus) is followed by the same word
  in each ("decimal to binary" is not "binary to decimal").

Words that differ only by a one-letter typo (``revese``/``reverse``) count as the same. The
checks are deliberately strict: a refused paraphrase costs one generation, a false hit serves a
wrong answer. They are measured on ``tests/data/semantic_pairs.jsonl``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
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
    """My words the other prompt lacks, typos of its words forgiven."""
    return {w for w in mine - theirs if not any(_close(w, t) for t in theirs - mine)}


def _followers(words: list[str]) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for i, w in enumerate(words):
        if w in CONNECTORS:
            nxt = next((x for x in words[i + 1:] if x not in _FILLER), "")
            pairs.add((w, _stem(nxt)))
    return pairs


@lru_cache(maxsize=4096)
def _profile(text: str) -> tuple:
    words = _words(text)
    return (words, _numbers(text, words), _negations(words), _quoted(text), _script(text), _entities(text))


def differs(a: str, b: str) -> str:
    """The first guard that tells prompts ``a`` and ``b`` apart, or "" if none does."""
    words_a, numbers_a, neg_a, quoted_a, script_a, names_a = _profile(a)
    words_b, numbers_b, neg_b, quoted_b, script_b, names_b = _profile(b)
    if numbers_a != numbers_b:
        return "number"
    if neg_a != neg_b:
        return "negation"
    # Quoted text must be in the other prompt too (quoted or not: 'cactus' and cactus agree).
    if any(q not in b.lower() for q in quoted_a) or any(q not in a.lower() for q in quoted_b):
        return "quoted"
    if script_a != script_b:
        return "script"
    if script_a == "LATIN":
        lang_a, lang_b = _latin_language(words_a), _latin_language(words_b)
        if lang_a and lang_b and lang_a != lang_b:
            return "language"
    set_a = {_stem(w) for w in words_a}
    set_b = {_stem(w) for w in words_b}
    only_a, only_b = _unmatched(set_a, set_b), _unmatched(set_b, set_a)
    if any(_stem(n) in only_a for n in names_a) or any(_stem(n) in only_b for n in names_b):
        return "entity"
    if any(_marked(w) for w in only_a | only_b):
        return "lexicon"
    # A connector both use must lead to the same words in each, one side's a subset of the
    # other's (an extra "to" of an infinitive is no contradiction; "X to Y" / "Y to X" is).
    fa, fb = _followers(words_a), _followers(words_b)
    for connector in {c for c, _ in fa} & {c for c, _ in fb}:
        after_a = {w for c, w in fa if c == connector}
        after_b = {w for c, w in fb if c == connector}
        if not (after_a <= after_b or after_b <= after_a):
            return "order"
    return ""
