"""`crescent up --model`: a model Crescent cannot serve is refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_an_unsupported_architecture_is_refused_before_any_service_starts(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "qwen2-moe"
    folder.mkdir()
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 128,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "crescent", "up", "--model", str(folder), "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Qwen2MoeForCausalLM is not supported; supported: LlamaForCausalLM" in done.stderr
    # Nothing was started: no logs, no secrets, no catalogue.
    assert not (data / "logs").exists() and not (data / "secrets").exists()
