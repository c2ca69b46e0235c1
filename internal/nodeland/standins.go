package nodeland

// The stand-ins a land puts in place of a node's tools and network. Each is
// a fixed script; @LAND@ is the land's folder (its logs and tools), @ARG@
// a script's one parameter.

// bsdStat is macOS's stat as far as scripts use it: -f FORMAT (%m the
// modification time, %z the size), and no GNU -c.
const bsdStat = `#!/bin/sh
case ${1:-} in
-f)
	case ${2:-} in
	%m) fmt=%Y ;;
	%z) fmt=%s ;;
	*) echo "stat: this stand-in knows only -f %m and -f %z" >&2; exit 1 ;;
	esac
	shift 2
	for f in "$@"; do @LAND@/orig-usr-bin/stat -c "$fmt" -- "$f" || exit 1; done
	;;
-*)
	echo "stat: illegal option -- $(printf '%s' "${1#-}" | cut -c1)" >&2
	echo "usage: stat [-FLnq] [-f format | -l | -r | -s | -x] [-t timefmt] [file ...]" >&2
	exit 1
	;;
*)
	for f in "$@"; do @LAND@/orig-usr-bin/stat -- "$f" || exit 1; done
	;;
esac
`

// withProc runs the real @ARG@ (ps, lsof), which reads /proc, where the
// real /proc is mounted back: a Mac's reads the kernel, and has no /proc
// to need.
const withProc = `#!/bin/sh
exec @LAND@/orig-usr-bin/unshare --mount @LAND@/orig-usr-bin/dash -c 'mount -t proc proc /proc && exec "$0" "$@"' @LAND@/orig-usr-bin/@ARG@ "$@"
`

// fakeCurl is the node's network: it serves what the default installers
// fetch and fails on anything else as curl does for an unknown host.
const fakeCurl = `#!/bin/sh
url=
for a in "$@"; do case $a in http://* | https://*) url=$a ;; esac; done
case $url in
https://astral.sh/uv/install.sh) exec cat @LAND@/tools/uv-install.sh ;;
esac
host=${url#*://}
echo "curl: (6) Could not resolve host: ${host%%/*}" >&2
exit 6
`

// uvInstaller behaves as https://astral.sh/uv/install.sh (a cargo-dist
// installer, docs.astral.sh/uv/reference/installer): it puts uv and uvx in
// $UV_INSTALL_DIR, else $XDG_BIN_HOME, else ~/.local/bin, writes an env
// script there, and adds a line sourcing it to the shell profiles (unless
// UV_NO_MODIFY_PATH or INSTALLER_NO_MODIFY_PATH). The running shell's PATH
// is left as it was: the caller's next "uv" is not found unless its PATH
// already has the directory.
const uvInstaller = `#!/bin/sh
set -u
echo "uv installer" >>@LAND@/logs/installs
dir=${UV_INSTALL_DIR:-${XDG_BIN_HOME:-$HOME/.local/bin}}
echo "downloading uv 0.9.5 x86_64-unknown-linux-gnu"
mkdir -p "$dir" || exit 1
cp @LAND@/tools/uv "$dir/uv" && cp @LAND@/tools/uv "$dir/uvx" || exit 1
cat >"$dir/env" <<'EOF'
#!/bin/sh
# add binaries to PATH if they aren't added yet
# affix colons on either side of $PATH to simplify matching
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        # Prepending path in case a system-installed binary needs to be overridden
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
EOF
echo "no checksums to verify"
echo "installing to $dir"
echo "  uv"
echo "  uvx"
echo "everything's installed!"
if [ -z "${UV_NO_MODIFY_PATH:-}${INSTALLER_NO_MODIFY_PATH:-}" ]; then
	touch "$HOME/.profile"
	for rc in .profile .bashrc .bash_profile .zshrc .zshenv; do
		[ -f "$HOME/$rc" ] || continue
		grep -qF '. "$HOME/.local/bin/env"' "$HOME/$rc" || printf '\n. "$HOME/.local/bin/env"\n' >>"$HOME/$rc"
	done
	echo
	echo "To add \$HOME/.local/bin to your PATH, either restart your shell or run:"
	echo
	echo "    source \$HOME/.local/bin/env (sh, bash, zsh)"
fi
`

// fakeUV is uv as far as the installers use it: "uv venv [--python V]
// [--seed] DIR" and "uv pip install --python PY PACKAGE…", which copies the
// test program a package stands for into the venv's bin.
const fakeUV = `#!/bin/sh
set -u
log=@LAND@/logs/installs
case ${1:-} in
--version)
	echo "uv 0.9.5"
	;;
venv)
	shift
	dir=.venv
	while [ $# -gt 0 ]; do
		case $1 in
		--python) shift ;;
		-*) ;;
		*) dir=$1 ;;
		esac
		shift
	done
	echo "Using CPython 3.12.12"
	echo "Creating virtual environment with seed packages at: $dir"
	mkdir -p "$dir/bin" || exit 1
	printf '#!/bin/sh\necho "Python 3.12.12"\n' >"$dir/bin/python" && chmod +x "$dir/bin/python"
	printf 'home = /usr/bin\nversion_info = 3.12.12\n' >"$dir/pyvenv.cfg"
	echo " + pip==25.3"
	echo "Activate with: source $dir/bin/activate"
	echo "uv venv $dir" >>"$log"
	;;
pip)
	[ "${2:-}" = install ] || { echo "error: this uv stand-in knows only pip install" >&2; exit 2; }
	shift 2
	py=
	pkgs=
	while [ $# -gt 0 ]; do
		case $1 in
		--python) shift; py=${1:-} ;;
		-*) ;;
		*) pkgs="$pkgs $1" ;;
		esac
		shift
	done
	[ -n "$py" ] && [ -x "$py" ] || { echo "error: No virtual environment found at ${py:-(no --python given)}; run uv venv to create one" >&2; exit 2; }
	for pkg in $pkgs; do
		line=$(awk -v p="$pkg" '$1 == p' @LAND@/tools/packages)
		[ -n "$line" ] || { echo "  × No solution found when resolving dependencies:" >&2; echo "  ╰─▶ Because $pkg was not found in the package registry and you require $pkg, we can conclude that your requirements are unsatisfiable." >&2; exit 1; }
		# NAME BIN FROM, split on purpose
		set -- $line
		if [ -x "${py%/*}/$2" ]; then
			echo "Audited 1 package in 3ms"
			continue
		fi
		echo "Resolved 1 package in 1.20s"
		cp "$3" "${py%/*}/$2" || exit 1
		echo "Installed 1 package in 12ms"
		echo " + $1==0.11.0"
		echo "uv pip install $1" >>"$log"
	done
	;;
*)
	echo "error: unrecognized subcommand '${1:-}'" >&2
	exit 2
	;;
esac
`

// fakeBrew is Homebrew at @ARG@ as far as the installers use it: "brew
// install FORMULA…" pours a bottle (copies the test program the formula
// stands for into the Cellar) and links it into @ARG@/bin, as brew does.
const fakeBrew = `#!/bin/sh
set -u
prefix=@ARG@
case ${1:-} in
--prefix)
	echo "$prefix"
	;;
install)
	shift
	for f in "$@"; do
		line=$(awk -v f="$f" '$1 == f' @LAND@/tools/formulae)
		[ -n "$line" ] || { echo "Error: No available formula with the name \"$f\"." >&2; exit 1; }
		if [ -d "$prefix/Cellar/$f" ]; then
			echo "Warning: $f 6097 is already installed and up-to-date."
			continue
		fi
		# NAME BIN FROM, split on purpose
		set -- $line
		echo "==> Fetching downloads for: $f"
		echo "==> Pouring $f--6097.arm64_sequoia.bottle.tar.gz"
		mkdir -p "$prefix/Cellar/$f/6097/bin" "$prefix/bin" || exit 1
		cp "$3" "$prefix/Cellar/$f/6097/bin/$2" || exit 1
		ln -sf "../Cellar/$f/6097/bin/$2" "$prefix/bin/$2"
		echo "🍺  $prefix/Cellar/$f/6097: 1 file"
		echo "brew install $f" >>@LAND@/logs/installs
	done
	;;
*)
	echo "Error: Unknown command: ${1:-}" >&2
	exit 1
	;;
esac
`
