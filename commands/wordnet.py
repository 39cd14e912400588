"""Writes the semantic cache's word lists from WordNet: opposites (``cache_service/data/antonyms.txt``)
and synonyms (``cache_service/data/synonyms.txt``).

Run ``python -m meshserve.commands.wordnet`` where Debian's ``wordnet-base`` is installed (its
database is in /usr/share/wordnet); ``--check`` fails if the committed lists differ from what the
database gives. The opposites are WordNet's antonym links between single words (ascending /
descending, maximum / minimum, before / after, import / export, ...), those of the adjectives
similar to them, and the adverbs derived from them (``antonyms``); and the swaps of a prefix that
make a word's opposite, learned from those pairs (``prefix_swaps``: un-, in-, hyper- / hypo-, ...).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "cache_service" / "data"
WORDNET = Path("/usr/share/wordnet")
_WORD = re.compile(r"^[a-z][a-z-]*[a-z]$")
# Synonyms are the words of a synset that is among the first SENSES senses of each (WordNet lists
# a word's senses most frequent first): "kid" / "child", "fall" / "autumn", not "lead" / "trail".
SENSES = 2
# A prefix swap (``prefix_swaps``) is kept when this many antonym pairs use it and this share of
# the word pairs it relates in WordNet are antonyms there: more often right than wrong.
MIN_SUPPORT = 10
MIN_PRECISION = 0.5
MIN_ENDING = 3  # letters the two words share after their prefixes
MAX_PREFIX = 5

HEADER = """\
# Words of opposite meaning from WordNet 3.0's antonym links (written by `python -m
# meshserve.commands.wordnet`; do not edit): "prefix: X Y" lines, prefixes whose swap makes a
# word's opposite ("-" for none: able / unable), then one pair of words a line.
#
# WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved.
# THIS SOFTWARE AND DATABASE IS PROVIDED "AS IS" AND PRINCETON UNIVERSITY MAKES NO
# REPRESENTATIONS OR WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION,
# PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES OF MERCHANTABILITY OR FITNESS FOR
# ANY PARTICULAR PURPOSE OR THAT THE USE OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL
# NOT INFRINGE ANY THIRD PARTY PATENTS, COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS.
# The name of Princeton University or Princeton may not be used in advertising or publicity
# pertaining to distribution of the software and/or database. Title to copyright in this
# software, database and any associated documentation shall at all times remain with Princeton
# University and LICENSEE agrees to preserve same.
"""


SYNONYMS_HEADER = HEADER.replace(
    "Words of opposite meaning from WordNet 3.0's antonym links", "Words of the same meaning from WordNet 3.0's synsets"
).replace(
    """: "prefix: X Y" lines, prefixes whose swap makes a
# word's opposite ("-" for none: able / unable), then one pair of words a line.""",
    """: one group a line, the single words of a synset
# that is among the first two senses of each.""")


def _synsets(path: Path) -> Iterator[tuple[str, str, list[str], list[tuple[str, str, str, str]]]]:
    """(offset, synset type, words, pointers) of each synset of a WordNet data file; a pointer is
    (symbol, target offset, target part of speech, source/target word numbers)."""
    for line in path.read_text(encoding="latin-1").splitlines():
        if not line or line.startswith(" "):  # the licence at the top of each file
            continue
        fields = line.split(" | ", 1)[0].split()
        offset, kind, count = fields[0], fields[2], int(fields[3], 16)
        words = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i].lower()) for i in range(count)]  # "galore(ip)"
        at = 4 + 2 * count
        pointers = [tuple(fields[at + 1 + 4 * i: at + 5 + 4 * i]) for i in range(int(fields[at]))]
        yield offset, kind, words, pointers  # type: ignore[misc]


def antonyms(wordnet: Path) -> set[tuple[str, str]]:
    """WordNet's antonym links between single words, in three steps:

    1. direct: the links themselves (ascending / descending);
    2. indirect: an adjective "similar to" one end of a link against the other end (double,
       similar to multiple, against single), as WordNet's own browser shows antonyms;
    3. adverbs: an adverb derived from one end against one derived from the other end (singly /
       doubly from single / double).
    """
    words: dict[tuple[str, str], list[str]] = {}
    direct: list[tuple[str, str, int, str, int]] = []  # (pos, offset, word no., target offset, word no.)
    similar: list[tuple[str, str]] = []  # (satellite offset, head offset)
    derived: list[tuple[str, int, str, int]] = []  # (adverb offset, word no., adjective offset, word no.)
    for pos, name in {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}.items():
        for offset, kind, synset_words, pointers in _synsets(wordnet / name):
            words[pos, offset] = synset_words
            for symbol, target, _, numbers in pointers:
                source, target_number = int(numbers[:2], 16), int(numbers[2:], 16)
                if symbol == "!":
                    direct.append((pos, offset, source, target, target_number))
                elif symbol == "&" and kind == "s":
                    similar.append((offset, target))
                elif symbol == "\\" and pos == "r":  # an adjective's "\\" points at a noun
                    derived.append((offset, source, target, target_number))

    # 1. direct
    pairs = {(words[pos, a][i - 1], words[pos, b][j - 1]) for pos, a, i, b, j in direct}
    # 2. indirect: every word of a satellite against the antonyms of its head's words
    opposite_of_head: dict[str, set[str]] = {}
    for pos, a, _, b, j in direct:
        if pos == "a":
            opposite_of_head.setdefault(a, set()).add(words["a", b][j - 1])
    for satellite, head in similar:
        pairs |= {(w, o) for w in words["a", satellite] for o in opposite_of_head.get(head, ())}
    # 3. adverbs
    adverbs: dict[str, set[str]] = {}  # adjective -> adverbs derived from it
    for adverb, i, adjective, j in derived:
        adverbs.setdefault(words["a", adjective][j - 1], set()).add(words["r", adverb][i - 1])
    pairs |= {(x, y) for a, b in list(pairs) for x in adverbs.get(a, ()) for y in adverbs.get(b, ())}
    return {tuple(sorted(p)) for p in pairs if all(_WORD.match(w) for w in p) and p[0] != p[1]}  # type: ignore[misc]


def _prefixes(x: str, y: str) -> tuple[str, str, str]:
    """(x's prefix, y's prefix, their common ending): ("un", "", "able") for unable / able."""
    n = 0
    while n < min(len(x), len(y)) and x[-1 - n] == y[-1 - n]:
        n += 1
    return x[:len(x) - n], y[:len(y) - n], x[len(x) - n:]


def prefix_swaps(wordnet: Path, pairs: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """Swaps of a prefix that make a word's opposite (able / unable, hyperthyroid / hypothyroid),
    learned from the pairs: a swap is kept when at least MIN_SUPPORT pairs use it and, of all the
    pairs of WordNet words it relates, at least MIN_PRECISION are antonyms in WordNet."""
    counts: dict[tuple[str, str], int] = {}
    for x, y in pairs:
        px, py, ending = _prefixes(x, y)
        if len(ending) >= MIN_ENDING and max(len(px), len(py)) <= MAX_PREFIX:
            swap = (px, py) if px < py else (py, px)
            counts[swap] = counts.get(swap, 0) + 1
    vocabulary = {line.split(" ", 1)[0] for name in ("index.noun", "index.verb", "index.adj", "index.adv")
                  for line in (wordnet / name).read_text(encoding="latin-1").splitlines() if not line.startswith(" ")}
    linked = pairs | {(y, x) for x, y in pairs}
    kept = []
    for (px, py), support in sorted(counts.items()):
        if support < MIN_SUPPORT:
            continue
        related = [(w, py + w[len(px):]) for w in vocabulary
                   if w.startswith(px) and len(w) - len(px) >= MIN_ENDING and py + w[len(px):] in vocabulary]
        if sum(pair in linked for pair in related) / len(related) >= MIN_PRECISION:
            kept.append((px, py))
    return kept


def render(pairs: set[tuple[str, str]], swaps: list[tuple[str, str]]) -> str:
    return (HEADER + "".join(f"prefix: {px or '-'} {py}\n" for px, py in swaps)
            + "".join(f"{a} {b}\n" for a, b in sorted(pairs)))


def synonyms(wordnet: Path) -> set[tuple[str, ...]]:
    """Groups of single words that share a synset among the first SENSES senses of each."""
    members: dict[tuple[str, str], set[str]] = {}  # (part of speech, synset offset) -> words
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (wordnet / f"index.{pos}").read_text(encoding="latin-1").splitlines():
            if line.startswith(" "):
                continue
            fields = line.split()
            lemma, senses = fields[0], int(fields[2])
            if _WORD.match(lemma):
                for offset in fields[len(fields) - senses:][:SENSES]:
                    members.setdefault((pos, offset), set()).add(lemma)
    return {tuple(sorted(words)) for words in members.values() if len(words) >= 2}


def render_synonyms(groups: set[tuple[str, ...]]) -> str:
    return SYNONYMS_HEADER + "".join(" ".join(g) + "\n" for g in sorted(groups))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wordnet", type=Path, default=WORDNET, help="WordNet's dict folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="fail if the committed list is not current")
    args = parser.parse_args(argv)
    pairs = antonyms(args.wordnet)
    groups = synonyms(args.wordnet)
    files = {DATA / "antonyms.txt": render(pairs, prefix_swaps(args.wordnet, pairs)),
             DATA / "synonyms.txt": render_synonyms(groups)}
    if args.check:
        stale = [str(f) for f, text in files.items() if not f.exists() or f.read_text() != text]
        if stale:
            print(f"{', '.join(stale)}: not what {args.wordnet} gives: run python -m meshserve.commands.wordnet",
                  file=sys.stderr)
        return 1 if stale else 0
    DATA.mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        file.write_text(text)
    print(f"{len(pairs)} pairs of opposites, {len(groups)} groups of synonyms written to {DATA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
