# shellcheck shell=sh
# fleet-enginectl: the only shell code enginectl runs on a node (see script.go).
set -u
# The node's environment, defined here once: every operation, every
# installer (install) and every engine (start) runs with it. sshd gives a
# command a bare PATH (macOS: /usr/bin:/bin:/usr/sbin:/sbin; Homebrew's
# shellenv is in ~/.zprofile, which only login shells read), and installers
# put engines and their tools in these: uv in ~/.local/bin (older ones in
# ~/.cargo/bin), Homebrew in /opt/homebrew (Apple Silicon) or /usr/local
# (Intel). Appended, so the system's own tools still come first.
PATH=${PATH:-/usr/bin:/bin}
for d in "$HOME/.local/bin" "$HOME/.cargo/bin" /opt/homebrew/bin /opt/homebrew/sbin /usr/local/bin /usr/local/sbin; do
	case ":$PATH:" in *":$d:"*) ;; *) PATH=$PATH:$d ;; esac
done
export PATH
op=$1
shift

# find_bin NAME: sets fb to the engine binary NAME runs: NAME itself when it
# is a path, else the first NAME on PATH, else one in the usual virtual
# environments off PATH (uv and pip venvs in ~/.venv*, conda's and
# miniforge's envs), where an engine installed by hand often is. Returns 1
# when there is none.
find_bin() {
	case $1 in
	*/*)
		fb=$1
		[ -f "$fb" ] && [ -x "$fb" ] && return 0
		fb=; return 1 ;;
	esac
	fb=$(command -v "$1" 2>/dev/null) && [ -n "$fb" ] && return 0
	for fb in "$HOME"/.venv*/bin/"$1" "$HOME"/venv*/bin/"$1" \
		"$HOME"/miniforge3/envs/*/bin/"$1" "$HOME"/miniforge3/bin/"$1" \
		"$HOME"/mambaforge/envs/*/bin/"$1" "$HOME"/mambaforge/bin/"$1" \
		"$HOME"/miniconda3/envs/*/bin/"$1" "$HOME"/miniconda3/bin/"$1" \
		"$HOME"/anaconda3/envs/*/bin/"$1" "$HOME"/anaconda3/bin/"$1" \
		"$HOME"/.conda/envs/*/bin/"$1" /opt/conda/envs/*/bin/"$1" /opt/conda/bin/"$1"; do
		[ -f "$fb" ] && [ -x "$fb" ] && return 0
	done
	fb=; return 1
}

have_proc() { [ -z "${FLEET_ENGINECTL_NO_PROC:-}" ] && [ -r /proc/self/stat ]; }

# expand_home WORD: sets xh to WORD with a leading ~/ as the node's home, as
# a login shell would do. It sets a variable instead of printing because
# $(...) strips trailing newlines, and arguments must arrive byte for byte.
expand_home() {
	# The ~ in the patterns is the literal character the caller sent.
	# shellcheck disable=SC2088
	case $1 in
	"~") xh=$HOME ;;
	"~/"*) xh=$HOME/${1#"~/"} ;;
	*) xh=$1 ;;
	esac
}

# stat_fields PID: "STATE PPID PGID" of a live process, nothing if gone.
stat_fields() {
	if have_proc; then
		line=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
		rest=${line##*) }
		# Split into fields on purpose: they are letters and numbers, no globs.
		# shellcheck disable=SC2086
		set -- $rest
		echo "$1 $2 $3"
	else
		ps -o stat=,ppid=,pgid= -p "$1" 2>/dev/null | awk 'NF >= 3 { print substr($1, 1, 1), $2, $3 }'
	fi
}

# group_members PGID: "PID STATE" of every non-zombie member.
group_members() {
	if have_proc; then
		cat /proc/[0-9]*/stat 2>/dev/null | awk -v pg="$1" '{
			pid = $1; sub(/^.*\) /, ""); split($0, f, " ")
			if (f[3] == pg && f[1] != "Z") print pid, f[1] }'
	else
		ps -A -o pid=,pgid=,stat= | awk -v pg="$1" '$2 == pg && $3 !~ /^Z/ { print $1, substr($3, 1, 1) }'
	fi
}

own_pgid() { stat_fields $$ | awk '{ print $3 }'; }

case $op in
start)
	# start STATEDIR STEM BIN ARGV...: launch ARGV in its own session, stdin
	# from /dev/null, output to STEM.log, and record STEM.pid and STEM.argv.
	expand_home "$1"; dir=$xh; stem=$2; expand_home "$3"; bin=$xh; shift 3
	[ -n "$dir" ] || dir=$HOME/.fleet
	n=$#
	while [ "$n" -gt 0 ]; do
		expand_home "$1"; shift; set -- "$@" "$xh"; n=$((n - 1))
	done
	mkdir -p "$dir" || { echo "cannot create the state directory $dir on the node" >&2; exit 73; }
	find_bin "$bin" || { echo "$bin: not found on the node (PATH=$PATH, nor in ~/.venv*, conda or miniforge envs); install the engine or set bin: in the recipe" >&2; exit 127; }
	# An engine found in a venv off PATH runs as if the venv were
	# activated: its python and tools first.
	case $bin in */*) ;; *) command -v "$bin" >/dev/null 2>&1 || { PATH=${fb%/*}:$PATH; export PATH; } ;; esac
	log=$dir/$stem.log; pidf=$dir/$stem.pid; argvf=$dir/$stem.argv
	[ -f "$log" ] && mv -f "$log" "$log.1"
	printf '%s\000' "$@" >"$argvf"
	# Once detached, the engine's shell writes the pid file before it
	# becomes the engine: an engine never runs without one, even when the
	# hub (and with it this script) is killed right after the fork. Every
	# exec keeps the PID.
	# shellcheck disable=SC2016 # expanded by that shell
	set -- sh -c 'echo "$$" >"$1.c" && mv -f "$1.c" "$1" || exit 73; shift; exec "$@"' fleet-engine "$pidf" "$@"
	if [ -z "${FLEET_ENGINECTL_NO_SETSID:-}" ] && command -v setsid >/dev/null 2>&1; then
		# A background job of a non-interactive sh is not a group leader,
		# so setsid(1) execs in place and $! stays the engine's PID.
		setsid "$@" </dev/null >"$log" 2>&1 &
	elif perl -MPOSIX -e 1 >/dev/null 2>&1; then
		# macOS has no setsid(1), but /usr/bin/perl.
		# shellcheck disable=SC2016 # perl's own variables
		perl -MPOSIX -e 'POSIX::setsid() or die "setsid: $!\n"; exec { $ARGV[0] } @ARGV or die "exec $ARGV[0]: $!\n"' "$@" </dev/null >"$log" 2>&1 &
	elif [ -n "${BASH_VERSION:-}" ]; then
		# bash (macOS's /bin/sh) gives a background job a process group of
		# its own under set -m, terminal or not: the group Stop signals,
		# apart from this script's. (dash cannot: it needs a terminal.)
		set -m
		"$@" </dev/null >"$log" 2>&1 &
		set +m
	elif python3 -c 'import os' >/dev/null 2>&1; then
		# Run, not just found: a Mac's /usr/bin/python3 without the
		# Command Line Tools is a stub that only offers to install them.
		python3 -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' "$@" </dev/null >"$log" 2>&1 &
	else
		echo "cannot detach the engine: the node has no setsid(1), its sh is not bash, and neither perl nor python3 runs; install one of them (on a Mac, the Command Line Tools: xcode-select --install)" >&2; exit 69
	fi
	pid=$!
	# Until setsid runs in the child, the engine is still in this script's
	# process group, and a hangup of the hub's session (or a kill of its
	# group) right after this prints the PID would take the engine with
	# it: on a busy node the child may not have run at all yet. So this
	# returns once the engine leads its own group, or is gone (WaitReady
	# reports that with its log).
	# A zombie (state Z) is gone too: this shell reaps it only on exit.
	while f=$(stat_fields "$pid"); do
		case $f in "" | Z* | X*) break ;; esac
		[ "${f##* }" = "$pid" ] && break
		sleep 0.01 2>/dev/null || sleep 1
	done
	# Written here too, so the pid file is there when this prints the PID.
	echo "$pid" >"$pidf.p" && mv -f "$pidf.p" "$pidf"
	printf 'pid=%s\nlog=%s\npidfile=%s\n' "$pid" "$log" "$pidf"
	;;
stat)
	# stat PID: "STATE PPID PGID", or nothing when the process is gone.
	stat_fields "$1"
	;;
group)
	# group PGID: the live members of a process group.
	group_members "$1"
	;;
signal)
	# signal SIG PGID: signal a whole process group, never our own.
	sig=$1; pg=$2
	case $pg in ''|*[!0-9]*|0|1) echo "refusing to signal process group '$pg'" >&2; exit 64 ;; esac
	[ "$pg" = "$(own_pgid)" ] && { echo "refusing to signal process group $pg: it is the controller's own" >&2; exit 64; }
	kill -s "$sig" -- "-$pg" 2>/dev/null || [ -z "$(group_members "$pg")" ] ||
		{ echo "cannot send $sig to process group $pg (does it belong to another user?)" >&2; exit 1; }
	;;
signalpid)
	# signalpid SIG PID: signal one process.
	case $2 in ''|*[!0-9]*|0|1) echo "refusing to signal PID '$2'" >&2; exit 64 ;; esac
	kill -s "$1" "$2" 2>/dev/null || [ -z "$(stat_fields "$2")" ] ||
		{ echo "cannot send $1 to PID $2 (does it belong to another user?)" >&2; exit 1; }
	;;
argv)
	# argv PID: the node's home, the executable, then the argv of PID.
	pid=$1
	[ -n "$(stat_fields "$pid")" ] || exit 3
	printf 'home=%s\n' "$HOME"
	# Whose engine it is: the fleet and launch start gave it (fleet_id=,
	# fleet_launch=), when its environment can be read.
	if have_proc; then
		tr '\000' '\n' <"/proc/$pid/environ" 2>/dev/null
	else
		ps eww -o command= -p "$pid" 2>/dev/null | tr ' ' '\n'
	fi | sed -n 's/^FLEET_ID=\([0-9a-f]*\)$/fleet_id=\1/p; s/^FLEET_LAUNCH=\([0-9]*\)$/fleet_launch=\1/p'
	if have_proc; then
		printf 'exe=%s\n' "$(readlink "/proc/$pid/exe" 2>/dev/null)"
		echo cmdline
		cat "/proc/$pid/cmdline"
	else
		printf 'exe=%s\n' "$(ps -o comm= -p "$pid")"
		echo args
		ps -ww -o args= -p "$pid"
	fi
	;;
launched)
	# launched PID PIDFILE ARGVFILE: what the start operation recorded (the
	# PID in PIDFILE, the argv in ARGVFILE) and how old the pid file and the
	# process are, in seconds, so that a PID reused by a later process, which
	# is younger than the pid file, is not taken for the engine.
	pid=$1; expand_home "$2"; pidf=$xh; expand_home "$3"; argvf=$xh
	[ -n "$(stat_fields "$pid")" ] || exit 3
	[ -f "$pidf" ] && [ -f "$argvf" ] || exit 4
	now=$(date +%s)
	mtime=$(stat -c %Y "$pidf" 2>/dev/null || stat -f %m "$pidf" 2>/dev/null)
	if have_proc; then
		line=$(cat "/proc/$pid/stat" 2>/dev/null) || exit 3
		rest=${line##*) }
		# Split into fields on purpose: they are letters and numbers, no globs.
		# shellcheck disable=SC2086
		set -- $rest
		shift 19
		hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
		elapsed=$(awk -v st="$1" -v hz="$hz" '{ printf "%d\n", $1 - st / hz }' /proc/uptime)
	else
		elapsed=$(ps -o etime= -p "$pid" | awk '{ n = split($1, a, /[-:]/); s = 0
			if (n == 4) s = a[1] * 86400 + a[2] * 3600 + a[3] * 60 + a[4]
			else if (n == 3) s = a[1] * 3600 + a[2] * 60 + a[3]
			else if (n == 2) s = a[1] * 60 + a[2]
			print s }')
	fi
	printf 'home=%s\npid=%s\npidfile_age=%s\nelapsed=%s\nargv\n' "$HOME" "$(cat "$pidf")" "$((now - mtime))" "$elapsed"
	cat "$argvf"
	;;
listeners)
	# listeners PORT: "PID PGID" of each process holding a TCP socket bound
	# to PORT for listening ("? ?" when the socket's owner is not visible to
	# us). vLLM binds its port long before it listens, so a bound, unconnected
	# socket counts too where /proc shows it.
	port=$1
	if have_proc; then
		hex=$(printf '%04X' "$port")
		inodes=$(awk -v p="$hex" -v ORS=' ' 'FNR > 1 { split($2, a, ":")
			if (a[2] == p && ($4 == "0A" || ($4 == "07" && $3 ~ /^0+:0000$/))) print $10 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
		[ -n "$inodes" ] || exit 0
		# ls -l is the portable way to read every fd's link target at once.
		# shellcheck disable=SC2012
		pids=$(ls -l /proc/[0-9]*/fd/ 2>/dev/null | awk -v inodes=" $inodes" '
			/^\/proc\/[0-9]+\/fd\/?:$/ { split($0, p, "/"); pid = p[3]; next }
			/-> socket:\[/ { s = $NF; gsub(/socket:\[|\]/, "", s); if (index(inodes, " " s " ") && !seen[pid]++) print pid }')
	elif command -v lsof >/dev/null 2>&1; then
		pids=$(lsof -nP -iTCP:"$port" -sTCP:LISTEN -t 2>/dev/null)
	else
		echo "cannot tell who listens on port $port: the node has neither /proc nor lsof" >&2; exit 69
	fi
	found=
	for pid in $pids; do
		f=$(stat_fields "$pid")
		[ -n "$f" ] || continue
		# shellcheck disable=SC2086 # "STATE PPID PGID", split on purpose
		set -- $f
		echo "$pid $3"; found=1
	done
	[ -n "$found" ] || [ -z "${inodes:-}" ] || echo "? ?"
	;;
tail)
	# tail N FILE
	expand_home "$2"
	[ -f "$xh" ] && tail -n "$1" "$xh"
	;;
tailbytes)
	# tailbytes N FILE: the last N bytes (progress bars redraw a line with
	# \r and never end it, so lines are no bound)
	expand_home "$2"
	[ -f "$xh" ] && tail -c "$1" "$xh"
	;;
which)
	# which BIN: the engine binary BIN resolves to (find_bin), exit 1 when
	# there is none (dash says 127, which a transport could also mean). A
	# path that is there but that this user cannot run (a directory on the
	# way it may not enter, or a file it may not execute) exits 3 saying
	# which.
	expand_home "$1"
	if find_bin "$xh"; then
		printf '%s\n' "$fb"
		exit 0
	fi
	case $xh in
	/*)
		me=$(id -un 2>/dev/null) || me="uid $(id -u)"
		dir=
		rest=${xh#/}
		while :; do
			case $rest in
			*/*) dir=$dir/${rest%%/*}; rest=${rest#*/} ;;
			*) break ;;
			esac
			if [ -d "$dir" ] && ! [ -x "$dir" ]; then
				# ls -ld of one path: only its mode, owner and group are read.
				# shellcheck disable=SC2012
				echo "$xh cannot be reached by the user $me: it has no search permission on the directory $dir ($(ls -ld "$dir" | awk '{ print $1, $3, $4 }'))" >&2
				exit 3
			fi
		done
		if [ -e "$xh" ]; then
			# shellcheck disable=SC2012
			echo "$xh is there but the user $me has no permission to run it ($(ls -ld "$xh" | awk '{ print $1, $3, $4 }'))" >&2
			exit 3
		fi
		;;
	esac
	exit 1
	;;
whichall)
	# whichall BIN...: one line per BIN, the binary it resolves to or empty.
	for b in "$@"; do
		expand_home "$b"
		find_bin "$xh" || true
		printf '%s\n' "$fb"
	done
	;;
install)
	# install SCRIPT: run an engine's installer (fleet's default or a
	# recipe's install:) in the node's environment above, so that it finds
	# Homebrew, and uv the moment its installer has put it in ~/.local/bin.
	exec sh -c "$1" fleet-install
	;;
*)
	echo "fleet-enginectl: unknown operation $op" >&2; exit 64
	;;
esac
