"""Two more generators of math word problems, beside ``specdiff.prompts``' templated set: ``broad`` (training:
rates, percentages, time, ages, geometry, money, in several phrasings) and ``other`` (evaluation only: other
templates, other names and objects, other sentence shapes, no shared instruction). No template, name list or
object list is shared between ``broad``/``prompts`` and ``other``, so a held-out problem differs from every
training problem in its wording, not only its numbers.
"""

from __future__ import annotations

import random

_BROAD_NAMES = ["Alice", "Bruno", "Carmen", "Dmitri", "Esther", "Felix", "Gita", "Hassan", "Ines", "Jack", "Keiko",
                "Luca", "Mei", "Nadia", "Oscar", "Paulo", "Rania", "Stefan", "Tomas", "Valeria"]
_BROAD_THINGS = ["oranges", "notebooks", "tickets", "bottles", "plants", "toy cars", "bananas", "beads", "boxes",
                 "candles"]
_OTHER_NAMES = ["Mr. Okafor", "Ms. Lindqvist", "Aunt Rosalind", "Coach Bernard", "Dr. Petrova", "Grandpa Eli",
                "Captain Moreau", "Mrs. Takahashi", "Professor Adeyemi", "Uncle Matteo"]
_OTHER_THINGS = ["jars of jam", "bags of rice", "crates of apples", "spools of thread", "loaves of bread",
                 "bundles of firewood", "cartons of eggs", "rolls of tape"]


def _broad(rng: random.Random) -> str:
    a, b = rng.sample(_BROAD_NAMES, 2)
    t = rng.choice(_BROAD_THINGS)
    x, y, z = rng.randint(4, 90), rng.randint(2, 15), rng.randint(2, 12)
    p = rng.choice([10, 20, 25, 30, 40, 50, 75])
    templates = [
        f"{a} had {x * 4} {t} and sold {p}% of them. How many {t} does {a} have left?",
        f"A car uses {y} litres of fuel for every 100 km. How much fuel does it need for a trip of {x * 10} km?",
        f"{a} is {z} years older than {b}. In {y} years their ages will add up to {x + 2 * y + z + 20}. How old is "
        f"{b} now?",
        f"A rectangle is {x} cm long and {y} cm wide. What are its area and its perimeter?",
        f"{a} works {y} hours a day for {z} days and earns {x} dollars an hour. How much does {a} earn in total?",
        f"A recipe needs {z} eggs for {y} people. How many eggs are needed for {y * z} people?",
        f"{a} starts reading at {rng.randint(1, 11)}:{rng.choice(['00', '15', '30', '45'])} and reads for {x} "
        f"minutes. At what time does {a} stop?",
        f"There are {x} {t} in a box. {a} takes {y}, {b} takes twice as many as {a}, and the rest are split between "
        f"{z} children. How many does each child get?",
        f"A shirt costs {x + 20} dollars. It is on sale for {p}% off. What is the sale price?",
        f"{a} saves {y} dollars every week. How many weeks does it take to save {y * x} dollars?",
        f"A tank holds {x * 10} litres. It is filled at {y} litres per minute. How long does it take to fill it from "
        f"empty?",
        f"The average of {z} numbers is {x}. One more number, {y * 3}, is added. What is the new average?",
    ]
    text = rng.choice(templates)
    return text + rng.choice(["", " Show your work.", " Explain your reasoning.", " Think step by step."])


def _other(rng: random.Random) -> str:
    a = rng.choice(_OTHER_NAMES)
    t = rng.choice(_OTHER_THINGS)
    x, y, z = rng.randint(5, 80), rng.randint(3, 14), rng.randint(2, 9)
    templates = [
        f"{a} runs a small stall at the market. On Monday {a} brought {x} {t}, sold {y} in the morning and {z} "
        f"times that number in the afternoon. Were any {t} left, and if so, how many?",
        f"In a school of {x * 10} pupils, {z * 10}% walk to school and the rest come by bus. Each bus carries {y * 5} "
        f"pupils. How many buses are needed?",
        f"{a} cycles to work at {y + 10} km/h and the trip takes {x} minutes. How far away is work?",
        f"A garden is shaped like a square with sides of {y} metres. {a} wants to put a fence around it, and the "
        f"fence costs {z} pounds per metre. What will the fence cost?",
        f"{a} bought {z} {t} for {x} euros in total and later sold each one for {y} euros. Did {a} make a profit or "
        f"a loss, and how much?",
        f"Three friends share a bill of {x * 3 + y} dollars. The first pays {y} dollars more than each of the other "
        f"two, who pay the same amount. How much does each pay?",
        f"A printer prints {y * 2} pages per minute. {a} needs {z} copies of a {x}-page report. How many minutes "
        f"will the printing take?",
        f"Last year {a} planted {x} trees. This year {a} planted {y} fewer than last year. How many trees were "
        f"planted over the two years?",
    ]
    return rng.choice(templates)


def word_problems(kind: str, n: int, seed: int = 0) -> list[str]:
    """``n`` distinct problems of generator ``kind`` (``broad`` or ``other``), seeded."""
    make = {"broad": _broad, "other": _other}.get(kind)
    if make is None:
        raise ValueError(f"kind must be 'broad' or 'other', got {kind!r}")
    rng, out, seen = random.Random(f"{kind}-{seed}"), [], set()
    for _ in range(50 * n):
        problem = make(rng)
        if problem not in seen:
            seen.add(problem)
            out.append(problem)
            if len(out) == n:
                break
    return out
