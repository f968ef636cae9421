"""YAML and comments for the configs the planner exports, written with PyYAML's ``safe_dump`` (no
hand-written emitter: every string is quoted or escaped as YAML needs, so a value holding a
newline, a colon or a quote stays one value and cannot add keys).

Multi-line strings (the run config inside a Kubernetes ConfigMap) are written as literal blocks
where YAML allows it. PyYAML is imported when a config is written, never at CLI start-up.
"""

from __future__ import annotations


def comment_lines(lines: list[str] | tuple[str, ...], mark: str = "#") -> list[str]:
    """Each line as a comment; a newline (or other line break) inside a line starts another
    comment line, so no value can end the comment and become code or keys."""
    out = []
    for line in lines:
        for part in str(line).splitlines() or [""]:
            out.append(f"{mark} {part}".rstrip())
    return out


def dump(value: dict | list, comments: list[str] | tuple[str, ...] = ()) -> str:
    """``value`` as a YAML document (block style, keys in the given order), after ``# comment`` lines."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, text: str):
        style = "|" if "\n" in text and text == text.strip(" ") and "\t" not in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    _Dumper.add_representer(str, _str)
    head = "".join(line + "\n" for line in comment_lines(comments))
    return head + yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                            width=1 << 16)
