"""A target model and its drafter head(s) in one cache folder: the type every model builder returns.

A builder writes its folders, then :meth:`ModelPair.save` writes ``pair.json`` (the names of the folders,
relative to the root, and the mask-token id); a folder without ``pair.json`` is not a pair. ``cached()``
is the lookup-or-build every builder shares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from peagle_contract.serving import speculative_config

from models import cache

MANIFEST = "pair.json"
REPORT = "training.json"



def drafter_config(folder: Path, k: int, *, parallel: bool) -> dict:
    """vLLM's speculative config for the head in ``folder``: P-EAGLE (parallel drafting) or EAGLE-3."""
    if parallel:
        return speculative_config(str(folder), num_speculative_tokens=k)
    return {"method": "eagle3", "model": str(folder), "num_speculative_tokens": k}

@dataclass(frozen=True)
class ModelPair:
    root: Path
    target: Path
    drafter: Path  # the P-EAGLE head (mask_hidden, a mask-token id): served with parallel drafting
    mask_token_id: int
    eagle3_drafter: Path | None = None  # a sequential EAGLE-3 head of the same target, for comparisons
    other_drafters: Mapping[str, Path] = field(default_factory=dict)  # more P-EAGLE heads, by name

    def speculative_config(self, k: int = 4, *, parallel: bool = True, head: str | None = None) -> dict:
        """vLLM's speculative config for the serving P-EAGLE head, another P-EAGLE ``head`` by name, or
        (``parallel=False``) the EAGLE-3 head."""
        if parallel:
            drafter = self.drafter if head is None else self.other_drafters.get(head)
            if drafter is None:
                raise ValueError(f"{self.root} has no P-EAGLE head {head!r}; allowed: {sorted(self.other_drafters)}")
            return drafter_config(drafter, k, parallel=True)
        if self.eagle3_drafter is None:
            raise ValueError(f"{self.root} has no EAGLE-3 head")
        return drafter_config(self.eagle3_drafter, k, parallel=False)

    def compared_heads(self) -> dict[str, tuple[Path, bool]]:
        """The heads a method comparison drafts with: ``{"p-eagle": (folder, True)}`` for the serving head, and
        ``"eagle3": (folder, False)`` where the pair has one (True: parallel drafting)."""
        heads = {"p-eagle": (self.drafter, True)}
        if self.eagle3_drafter is not None:
            heads["eagle3"] = (self.eagle3_drafter, False)
        return heads

    def heads(self) -> dict[str, tuple[Path, bool]]:
        """Every head by its folder's name: ``(folder, parallel drafting)``."""
        found = {self.drafter.name: (self.drafter, True),
                 **{folder.name: (folder, True) for folder in self.other_drafters.values()}}
        if self.eagle3_drafter is not None:
            found[self.eagle3_drafter.name] = (self.eagle3_drafter, False)
        return found

    def head_entries(self) -> dict[str, str]:
        """Each head's cache entry by its folder's name: which trained weights a report measured."""
        return {name: folder.resolve().name for name, (folder, _) in self.heads().items()}

    def trained_k(self) -> int | None:
        """The K the serving head's config.json says it was trained for (the runtime refuses more); None: unsaid."""
        from peagle_contract.drafter import trained_k

        found = trained_k(json.loads((self.drafter / "config.json").read_text()))
        return None if found is None else found[1]

    def report(self) -> dict:
        """What the builder measured while it trained (empty for an untrained pair)."""
        path = self.root / REPORT
        return json.loads(path.read_text()) if path.is_file() else {}

    def save(self) -> "ModelPair":
        folders = {"target": self.target, "drafter": self.drafter, "eagle3_drafter": self.eagle3_drafter}
        info: dict = {k: str(v.relative_to(self.root)) for k, v in folders.items() if v is not None}
        if self.other_drafters:
            info["other_drafters"] = {k: str(v.relative_to(self.root)) for k, v in self.other_drafters.items()}
        (self.root / MANIFEST).write_text(json.dumps({**info, "mask_token_id": self.mask_token_id}) + "\n")
        return self

    @classmethod
    def load(cls, root: Path) -> "ModelPair | None":
        manifest = root / MANIFEST
        if not manifest.is_file():
            return None
        info = json.loads(manifest.read_text())
        return cls(root=root, target=root / info["target"], drafter=root / info["drafter"],
                   mask_token_id=int(info["mask_token_id"]),
                   eagle3_drafter=root / info["eagle3_drafter"] if info.get("eagle3_drafter") else None,
                   other_drafters={k: root / v for k, v in info.get("other_drafters", {}).items()})


def cached(root: Path, write: Callable[[Path], object], *, force: bool = False) -> ModelPair:
    """The pair in ``root``; built first by ``write(folder)`` (which must save a pair there) when absent."""
    if not force:
        pair = ModelPair.load(root)
        if pair is not None:
            return pair
    cache.publish(root, write, prefix=f"{root.name}-build-", replace=force)
    pair = ModelPair.load(root)
    if pair is None:
        raise RuntimeError(f"the builder of {root} wrote no {MANIFEST}")
    return pair
