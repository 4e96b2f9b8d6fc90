#!/bin/sh
# tests/call_line.sh BUILD — the files of fs/ns, of fs/daemon and the agent's
# files of replicator/ each form a line (docs/design.md, "Module map"): each
# file calls only the files after it in its list below, so no two files call
# each other, directly or round a circle.  Checked on the objects in BUILD (nm: a symbol a file uses that
# another file of its folder defines).  A new file of either folder must be
# given its place here.  Exit 0, or 1 naming every call against the line.
set -eu
build=${1:-build}
NS_LINE="fuse_ops fuse_readaround ns_life ns_tree ns_io ns_version ns_tensors ns_tp ns ns_tp_file"
DAEMON_LINE="daemon daemon_ns_hooks daemon_ops daemon_repl daemon_commit daemon_publish
daemon_diff daemon_engine_ops daemon_gpu daemon_lease daemon_http daemon_req engine_registry
own_mount"
AGENT_LINE="agent agent_commit agent_recv agent_pull agent_serve agent_pool"

bad=0
check() { # check DIR "LINE" [GLOB]: every DIR/GLOB (*.c) has a place in LINE
	dir=$1
	line=$2
	for src in "$dir"/${3:-*.c}; do
		f=$(basename "$src" .c)
		case " $(echo $line) " in
		*" $f "*) ;;
		*) echo "call_line: $src has no place in the line of $dir (tests/call_line.sh)"
		   bad=1 ;;
		esac
	done
	for f in $line; do
		[ -f "$build/$dir/$f.o" ] || { echo "call_line: no $build/$dir/$f.o (build first)"; exit 1; }
	done
	defs=$(for f in $line; do
		nm --defined-only -g "$build/$dir/$f.o" | awk -v f="$f" 'NF == 3 { print $3, f }'
	done)
	pos=0
	for f in $line; do
		pos=$((pos + 1))
		for sym in $(nm -u "$build/$dir/$f.o" | awk '{ print $2 }'); do
			owner=$(echo "$defs" | awk -v s="$sym" '$1 == s { print $2; exit }')
			[ -n "$owner" ] && [ "$owner" != "$f" ] || continue
			opos=0
			for g in $line; do
				opos=$((opos + 1))
				[ "$g" = "$owner" ] && break
			done
			if [ "$opos" -le "$pos" ]; then
				echo "call_line: $dir/$f.c calls $sym of $owner.c, which comes before it"
				bad=1
			fi
		done
	done
}
check fs/ns "$NS_LINE"
check fs/daemon "$DAEMON_LINE"
check replicator "$AGENT_LINE" "agent*.c"
[ "$bad" = 0 ] && echo "call_line: fs/ns, fs/daemon and replicator/agent*.c each form a line"
exit "$bad"
