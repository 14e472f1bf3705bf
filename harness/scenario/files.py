"""Scenario files: YAML validated by pydantic. A bad file raises `ScenarioError` whose message
names the file and the field.

The file is checked on its own here: UTF-8 text, YAML without aliases or repeated keys,
strict types (`true` is not a count, `4.5` is not an integer), counts and sizes capped so a
typo cannot ask for 10**21 requests, known engine names, no engine listed twice. What needs
the model, the tokenizer, datasets or the engines' own option schemas is checked by
`harness.run.preflight` before any engine starts."""
from __future__ import annotations

from pathlib import Path
from typing import Any
import yaml
from pydantic import ValidationError

from harness.scenario.errors import ScenarioError, field_errors
from harness.scenario.fields import MAX_FILE_BYTES
from harness.scenario.schema import Scenario


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: the file must hold a mapping of fields, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: invalid scenario"] + [f"  field {w}: {m}" for w, m in field_errors(e)[:20]]
        raise ScenarioError("\n".join(lines)) from None


class StrictLoader(yaml.SafeLoader):
    """Safe YAML without aliases (an alias bomb expands to gigabytes) or repeated keys (the
    last one would silently win)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in scenario files",
                                              event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice",
                                                        key_node.start_mark)
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return super().construct_mapping(node, deep)


def read_text(path: Path, what: str = "scenario file", limit: int = MAX_FILE_BYTES) -> str:
    """A file's text: UTF-8 (a BOM is allowed), at most `limit` bytes; ScenarioError else."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read {what} ({e.strerror})") from None
    if len(raw) > limit:
        raise ScenarioError(f"{path}: {what} is over {limit:,} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: {what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                            "save it as UTF-8") from None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    if path.is_dir():
        raise ScenarioError(f"{path}: is a folder, not a scenario file")
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        raise ScenarioError(f"{path}: the file is empty (or only comments); a scenario is a mapping of fields, "
                            f"see scenarios/reference.yaml, which has every field")
    return parse_scenario(data, str(path))
