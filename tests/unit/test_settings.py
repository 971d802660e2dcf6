"""The operator's settings file: every documented key is taken, and nothing
at that path can hang or crash a verb."""

from __future__ import annotations

import json
import os

import pytest

from paracell import settings
from paracell.errors import ParacellError
from tests.settings_doc import documented_settings, keys_named_in_prose


def test_the_table_documents_every_key_the_code_takes():
    assert set(documented_settings()) == set(settings.CONFIG_KEYS)


def test_every_key_the_docs_name_is_taken():
    named = keys_named_in_prose()
    assert "pod_memory_mib" in named  # the README's own sentence
    assert named <= set(settings.CONFIG_KEYS), named - set(settings.CONFIG_KEYS)


def test_the_documented_examples_are_accepted(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(documented_settings()))
    monkeypatch.setenv("PARACELL_CONFIG", str(path))
    for name in ("PARACELL_POD_MEMORY_MIB", "PARACELL_GUEST_MEMORY_MIB", "PARACELL_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    assert settings.pod_memory_mib() == documented_settings()["pod_memory_mib"]
    assert settings.engine_override() == documented_settings()["engine"]


@pytest.mark.parametrize("make, message", [
    (lambda p: os.mkfifo(p), "is not a regular file"),
    (lambda p: p.mkdir(), "is not a regular file"),
    (lambda p: p.write_text("[" * 30000 + "]" * 30000), "exceeded max depth"),
    (lambda p: p.write_text("{"), "is not valid JSON"),
    (lambda p: p.write_text("[]"), "expected a JSON object"),
    (lambda p: p.write_bytes(b" " * 70000), "larger than"),
])
def test_a_bad_file_is_one_error(tmp_path, monkeypatch, make, message):
    path = tmp_path / "config.json"
    make(path)
    monkeypatch.setenv("PARACELL_CONFIG", str(path))
    with pytest.raises(ParacellError, match=message) as refused:
        settings.file_config()
    assert "\n" not in str(refused.value)
