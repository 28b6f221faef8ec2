#!/usr/bin/env bash
# Run here, once, before `benchmarks/gpu_check.sh` goes to a GPU machine that has no network: the pinned
# transformers wheel into .whl/ and a config-only Llama-3.1-8B beside the embedded model's tokenizer into
# .gpu/llama-3.1-8b/ (the embedded model itself, 92 MB, is too large to travel). Both folders are ignored
# by git through .git/info/exclude and travel as carried paths.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
for folder in /.whl/ /.gpu/; do grep -qxF "$folder" .git/info/exclude || echo "$folder" >>.git/info/exclude; done
mkdir -p .whl .gpu/llama-3.1-8b
version=$($PY -c "import transformers; print(transformers.__version__)")
ls .whl/transformers-"$version"-*.whl >/dev/null 2>&1 ||
  $PY -m pip download --quiet --no-deps --only-binary=:all: -d .whl "transformers==$version"
$PY - <<'PY'
import shutil
from pathlib import Path

from bcr_core.engine.architectures import config_only
from bcr_core.engine.models import embedded_model_dir

target = Path(".gpu/llama-3.1-8b")
config_only("config:llama-3.1-8b").to_json_file(target / "config.json")
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(embedded_model_dir() / name, target / name)
print(f"prepared {target} and .whl/: carry ['.gpu', '.whl']")
PY
