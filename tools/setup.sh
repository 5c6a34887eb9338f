#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian libraries, Python 3.12 venv in .venv, the project and its
# test extras. A second run only checks and returns in seconds (a stamp records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages: EGL/Mesa for offscreen MuJoCo rendering, FFmpeg 5.1 shared libraries for torchcodec,
#    Chromium and its WebDriver for the viewer's browser tests (tests/test_viewer.py, tools/screenshot_viewer.py),
#    FUSE 3 (fusermount3, and the headers, pkg-config and gcc that build pyfuse3) for the power-cut file system
#    (tools/powercut_fs.py, tests/test_power_cut.py); cmake, make and g++ build robomimic's egl_probe (test extra).
DEB_PACKAGES=(libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0 libosmesa6
              libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4
              chromium chromium-driver
              fuse3 libfuse3-dev pkg-config gcc
              cmake make g++)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq </dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
fi

# 2. Python 3.12 (lerobot 0.6.x needs it).
find_python() {
    local c
    for c in "${DEMOFORGE_PYTHON:-}" python3.12 \
             "$(command -v pyenv >/dev/null 2>&1 && echo "$(pyenv root)/versions/3.12.1/bin/python3.12")" \
             "$HOME/.pyenv/versions/3.12.1/bin/python3.12"; do
        [ -n "$c" ] || continue
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$c"; return 0
        fi
    done
    # Any pyenv-installed 3.12.x.
    for c in "$HOME"/.pyenv/versions/3.12.*/bin/python3.12; do [ -x "$c" ] && { echo "$c"; return 0; }; done
    return 1
}
if [ ! -x .venv/bin/python ]; then
    PY=$(find_python) || { say "Python 3.12 not found (set DEMOFORGE_PYTHON or install it with pyenv)"; exit 1; }
    say "creating .venv with $PY"
    "$PY" -m venv .venv
fi

# 3. Python packages and the one C loop (storage/rgb_sums.c, built in place by the editable install); the stamp
# holds a hash of what the install reads, so an edit of any of it, or a missing build, triggers a reinstall.
stamp=.venv/.demoforge-installed
want=$(cat pyproject.toml setup.py storage/rgb_sums.c | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! compgen -G 'storage/_rgb_sums*.so' >/dev/null; then
    say "installing Python packages (first run downloads a few GiB: torch comes as a CUDA build)"
    .venv/bin/python -m pip install -q --upgrade pip </dev/null
    .venv/bin/python -m pip install -q -e '.[test,ray]' </dev/null  # one resolve: see pyproject's ray extra
    .venv/bin/python -m pip install -q --no-deps robosuite==1.5.2 </dev/null  # pins mink==0.0.5: see pyproject.toml
    echo "$want" > "$stamp"
fi
# The editable install maps the repository folders into the demoforge package; check that it imports.
MUJOCO_GL=egl .venv/bin/python -c 'import demoforge.pipeline, demoforge.storage, demoforge.stages, demoforge.storage.rgb_sums' \
    || { rm -f "$stamp"; say "import check failed; re-run tools/setup.sh"; exit 1; }
# Bytecode for the project's own modules, written once here: where PYTHONDONTWRITEBYTECODE is set (as on this
# workplace's machines) every CLI process, worker and encoder child would otherwise compile them again (about
# 0.25 s of CPU each; the suite starts hundreds). Python checks each file's timestamp, so edits stay live.
.venv/bin/python -m compileall -q -j 0 pipeline stages storage >/dev/null
