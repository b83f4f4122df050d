"""docs/settings.md is what the settings class says: every field described, the file up to date."""

from __future__ import annotations

from pathlib import Path

from inferq.shared import settings_doc
from inferq.shared.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_every_setting_has_a_description() -> None:
    missing = [name for name, f in Settings.model_fields.items() if not (f.description or "").strip()]
    assert not missing, f"give these Settings fields a description= (shared/settings.py): {missing}"


def test_every_setting_is_in_one_section() -> None:
    names = [n for _, group in settings_doc.sections() for n in group]
    assert sorted(names) == sorted(Settings.model_fields)
    assert len(names) == len(set(names))


def test_the_settings_reference_is_up_to_date() -> None:
    expected = settings_doc.render()
    actual = DOC.read_text() if DOC.exists() else ""
    assert actual == expected, (
        f"docs/settings.md differs from the settings in shared/settings.py; regenerate it with "
        f"`.venv/bin/{settings_doc.COMMAND}`")
