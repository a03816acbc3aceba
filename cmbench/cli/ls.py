"""``python -m cmbench ls [group ...]``: what each config group offers, one line per entry."""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from cmbench.config_paths import GROUPS, config_dirs


def entries(group: str) -> dict[str, dict[str, str]]:
    """Configs of one group across all config folders (later folders override earlier ones).

    Returns
    -------
    dict name -> {"description": ..., "paper": ..., "origin": folder}
    """
    found: dict[str, dict[str, str]] = {}
    for folder in config_dirs():
        for path in sorted((folder / group).glob("*.yaml")):
            cfg = OmegaConf.load(path)
            # experiment configs are global packages: their documentation sits under `experiment:`
            doc = cfg.get(group) if group == "experiment" and isinstance(cfg.get(group), DictConfig) else cfg
            if group == "method":
                doc = method_doc(cfg)
            found[path.stem] = {
                "description": str(doc.get("description", "") or ""),
                "paper": str(doc.get("paper", "") or ""),
                "origin": str(folder),
            }
    return found


def method_doc(cfg: DictConfig) -> dict[str, str]:
    """A method's description and paper, from the class its yaml names (the yaml's own text when it
    names none, or when the class cannot be imported: then the reason)."""
    from cmbench.errors import ConfigError
    from cmbench.methods.registry import config_class

    if not (cfg.get("name") or cfg.get("_target_")):
        return {"description": str(cfg.get("description", "") or ""), "paper": str(cfg.get("paper", "") or "")}
    try:
        cls = config_class(cfg)
    except ConfigError as err:
        return {"description": f"(unavailable: {err})", "paper": ""}
    return {"description": cls.description, "paper": cls.paper}


def ls(args: list[str]) -> int:
    """Print the entries of the named groups (all groups when none is named)."""
    unknown = [g for g in args if g not in GROUPS]
    if unknown:
        print(f"cmbench ls: unknown group(s) {', '.join(unknown)}; groups are {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    for group in args or GROUPS:
        found = entries(group)
        print(f"{group}/ ({len(found)})")
        width = max((len(n) for n in found), default=0)
        for name, info in found.items():
            paper = f"  [{info['paper']}]" if info["paper"] else ""
            print(f"  {name.ljust(width)}  {info['description']}{paper}")
    return 0
