#!/usr/bin/env bash
# Creates (or reuses) the isolated virtual environment that the Petastorm baseline runs in.
# Petastorm needs an older pyarrow/numpy/pandas than detload, so it lives apart and is driven
# through petastorm_runner.py as a subprocess. Prints the environment's python path on success.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PETASTORM_VENV:-$here/.venv-petastorm}"
python="${PYTHON:-python3}"

# This combination is known to import and read; newer pyarrow/numpy 2 break petastorm 0.13.1.
pins=(petastorm==0.13.1 pyarrow==14.0.2 "numpy<2" "pandas<2.3")

# The marker records the pins, so changing them above triggers a reinstall instead of a stale reuse.
marker="$venv/.pins"
wanted="${pins[*]}"

if [[ -x "$venv/bin/python" && -f "$marker" && "$(cat "$marker")" == "$wanted" ]] \
    && "$venv/bin/python" -c "import petastorm, pyarrow, numpy" >/dev/null 2>&1; then
    echo "petastorm env already present: $venv/bin/python" >&2
else
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2
    # Import check here rather than at first benchmark run, so a broken combination fails loudly now.
    "$venv/bin/python" -c "import petastorm, pyarrow, numpy; print('petastorm', petastorm.__version__, 'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)" >&2
    echo "$wanted" > "$marker"
    echo "petastorm env created: $venv/bin/python" >&2
fi

# stdout carries only the interpreter path so callers can do PY=$(bash make_petastorm_env.sh).
echo "$venv/bin/python"
