#!/bin/bash
# dgl 2.1.0 imports graphbolt unconditionally and looks for a library built for the installed
# torch; an empty one lets it import (GraphBolt ops are unused: we never pass use_graphbolt=True).
# Usage: scripts/graphbolt_shim.sh PYTHON (the interpreter whose dgl and torch get the shim).
set -euo pipefail
PY=${1:?PYTHON}
GB_DIR=$("$PY" -c "import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec('dgl').origin), 'graphbolt'))")
TV=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
SHIM="$GB_DIR/libgraphbolt_pytorch_$TV.so"
[ -f "$SHIM" ] || echo "" | gcc -x c -shared -fPIC -o "$SHIM" -
