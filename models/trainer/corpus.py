"""A synthetic training corpus with real structure, and held-out prompts that never occur in it.

A tiny model trained for a few minutes can only become predictable on text that *is* predictable, so every
document is built from templates whose continuation follows from what came before: small Python functions,
counting and arithmetic, calendar cycles and templated sentences. Words and numbers are drawn from seeded
generators; the held-out prompts use a disjoint set of function names and starting numbers, and a test
checks that none of them appears in the corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Names the corpus may use; held-out prompts draw from HELD_OUT_NAMES only.
TRAIN_NAMES = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "lambda_", "zeta",
               "total", "count", "value", "result", "index", "score", "width", "height", "speed", "weight")
HELD_OUT_NAMES = ("amount", "budget", "length", "offset")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
ANIMALS = ("fox", "cat", "dog", "bird", "horse", "rabbit", "mouse", "wolf")
COLOURS = ("red", "blue", "green", "brown", "white", "black")
PLACES = ("river", "forest", "garden", "village", "market", "bridge")


@dataclass(frozen=True)
class CorpusSpec:
    seed: int = 1234
    documents: int = 2400
    pieces_per_document: tuple[int, int] = (3, 6)


def _function(rng: random.Random, names: tuple[str, ...]) -> str:
    name = rng.choice(names)
    k = rng.randint(1, 9)
    op, word = rng.choice((("+", "add"), ("-", "sub"), ("*", "mul")))
    return (f"def {word}_{name}(x):\n"
            f"    {name} = x {op} {k}\n"
            f"    return {name}\n\n")


def _loop(rng: random.Random, names: tuple[str, ...]) -> str:
    name = rng.choice(names)
    n = rng.randint(2, 9)
    return (f"{name} = 0\n"
            f"for i in range({n}):\n"
            f"    {name} += i\n"
            f"print({name})\n\n")


def _counting(rng: random.Random, start_range: tuple[int, int]) -> str:
    start = rng.randint(*start_range)
    step = rng.choice((1, 1, 2, 5, 10))
    numbers = " ".join(str(start + step * i) for i in range(rng.randint(6, 12)))
    return f"count by {step}: {numbers}\n"


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    return f"{a} + {b} = {a + b}\n"


def _table(rng: random.Random) -> str:
    n = rng.randint(2, 9)
    return "".join(f"{n} x {i} = {n * i}\n" for i in range(1, rng.randint(5, 10)))


def _calendar(rng: random.Random) -> str:
    cycle = rng.choice((DAYS, MONTHS))
    start = rng.randrange(len(cycle))
    length = rng.randint(4, len(cycle) + 2)
    return ", ".join(cycle[(start + i) % len(cycle)] for i in range(length)) + ".\n"


def _sentence(rng: random.Random) -> str:
    animal, colour, place = rng.choice(ANIMALS), rng.choice(COLOURS), rng.choice(PLACES)
    return (f"The {colour} {animal} runs to the {place}. "
            f"At the {place} the {colour} {animal} rests, and then the {animal} goes home.\n")


def _piece(rng: random.Random, names: tuple[str, ...], start_range: tuple[int, int]) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        return _function(rng, names)
    if kind == 1:
        return _loop(rng, names)
    if kind == 2:
        return _counting(rng, start_range)
    if kind == 3:
        return "".join(_arithmetic(rng) for _ in range(rng.randint(2, 4)))
    if kind == 4:
        return _table(rng)
    if kind == 5:
        return _calendar(rng)
    return _sentence(rng)


def make_corpus(spec: CorpusSpec = CorpusSpec()) -> list[str]:
    """The training documents: same spec, same list, on any machine."""
    rng = random.Random(spec.seed)
    docs = []
    for _ in range(spec.documents):
        pieces = rng.randint(*spec.pieces_per_document)
        docs.append("".join(_piece(rng, TRAIN_NAMES, (0, 60)) for _ in range(pieces)))
    return docs


def held_out_prompts(count: int = 12, seed: int = 99) -> list[str]:
    """Prompts for the benchmark: names and starting numbers the corpus never uses.

    Each prompt is the opening of a structured piece, so the model's continuation is predictable text.
    """
    rng = random.Random(seed)
    prompts: list[str] = []
    makers = (
        lambda: f"def add_{rng.choice(HELD_OUT_NAMES)}(x):\n",
        lambda: f"{rng.choice(HELD_OUT_NAMES)} = 0\nfor i in range(",
        lambda: f"count by 1: {(s := rng.randint(200, 400))} {s + 1} {s + 2}",
        lambda: f"{rng.randint(21, 40)} + {rng.randint(21, 40)} = ",
        lambda: f"{rng.randint(11, 19)} x 1 = ",
        lambda: f"def mul_{rng.choice(HELD_OUT_NAMES)}(x):\n    ",
    )
    while len(prompts) < count:
        prompts.append(makers[len(prompts) % len(makers)]())
    return prompts
