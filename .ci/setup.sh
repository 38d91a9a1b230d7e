# Set-up steps shared by .ci/example (`make example`) and .ci/test (`make test`); sourced, not run.
# Each step installs only what is missing, says what it does, and can be run again. Without apt, or
# without root or sudo, the optional Debian packages are skipped with a line that says what that costs.

say() { echo "[setup] $*"; }

# debian_packages WHY PACKAGE...: Debian's packages, where apt exists and we may use it.
debian_packages() {
    local why=$1 missing=() sudo=""
    shift
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "present: $* ($why)"
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        say "skipped: ${missing[*]}, no apt-get here ($why)"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        if sudo -n true 2>/dev/null; then sudo=sudo; else
            say "skipped: ${missing[*]}, which needs root or sudo ($why): sudo apt-get install ${missing[*]}"
            return 0
        fi
    fi
    say "apt-get install ${missing[*]} ($why)"
    # A fresh machine has no package lists yet: read them once, then try again.
    $sudo apt-get install -y --no-install-recommends "${missing[@]}" \
        || { $sudo apt-get update -q && $sudo apt-get install -y --no-install-recommends "${missing[@]}"; } \
        || say "skipped: apt-get could not install ${missing[*]} ($why)"
}

# python_env EXTRAS: .venv with an editable install of the package and EXTRAS (e.g. "test,ecosystem").
# pip runs again only when setup.cfg or the extras asked for change.
python_env() {
    local extras=$1 stamp wanted
    local spec=".${extras:+[$extras]}"
    if [ ! -x .venv/bin/python ]; then
        say "python3 -m venv .venv"
        python3 -m venv .venv || {
            debian_packages "python3 -m venv needs it on Debian and Ubuntu" python3-venv
            python3 -m venv .venv
        }
    fi
    stamp=.venv/.trainer-setup-${extras:-base}
    wanted=$(cat setup.cfg | sha256sum | cut -c1-16)
    if [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ]; then
        say "present: .venv with $spec (setup.cfg unchanged since it was installed)"
        return 0
    fi
    say ".venv/bin/pip install -e \"$spec\""
    .venv/bin/pip install -q -e "$spec"
    echo "$wanted" >"$stamp"
}

# python_of VERSION: a Python VERSION (e.g. 3.12) to make a venv with: python3.12 on the PATH, else pyenv's,
# else (said) the machine's python3.
python_of() {
    local version=$1 found
    if "python$version" --version >/dev/null 2>&1; then command -v "python$version"; return 0; fi
    found=$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/$version".*/bin/python3 2>/dev/null \
        | sort -V | tail -1)
    if [ -n "$found" ]; then echo "$found"; return 0; fi
    say "skipped: no Python $version here (python$version, pyenv); the tier runs on python3 instead" >&2
    command -v python3
}
