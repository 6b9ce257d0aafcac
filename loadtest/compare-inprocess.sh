#!/usr/bin/env bash
# Side-by-side throughput of the proxy's built-in "hi" handler against the
# bare net/http baseline (cmd/hiserver), issue 2.
#
# Both servers run at once on loopback; each round runs wrk against one then
# the other, swapping the order every round so neither side always gets the
# warmer (or quieter) slot on a shared machine. Per run it records req/s, p99
# latency and the server process's CPU time per request (utime+stime from
# /proc/PID/stat), and prints the medians at the end.
#
# The proxy runs with NO config: every PROXY_* variable is removed from its
# environment except the two listen addresses, so it serves "hi" at / with
# its default access log and metrics on. Its logs go to a temp file.
#
# Knobs (environment):
#   ROUNDS=5            rounds of (bare, proxy) pairs
#   DURATION=10s        wrk -d per run (s, m or h suffix)
#   CONNS=100           wrk -c
#   BARE_ADDR=127.0.0.1:19000    hiserver listen address
#   PROXY_ADDR=127.0.0.1:18000   proxy PROXY_HTTP_ADDR
#   ADMIN_ADDR=127.0.0.1:18080   proxy PROXY_ADMIN_ADDR
#   PROXY_BIN=path      use this proxy binary instead of building ./cmd/proxy;
#                       PROXY_BIN=hiserver runs a second hiserver on
#                       PROXY_ADDR, to check the script itself (ratio ~1.00)
#   KEEP_LOGS=1         keep the temp dir (binaries, server logs, wrk output)
#
# Usage: loadtest/compare-inprocess.sh
#        ROUNDS=2 DURATION=3s PROXY_BIN=hiserver loadtest/compare-inprocess.sh
set -euo pipefail

export PATH=$PATH:/usr/local/go/bin

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-100}
BARE_ADDR=${BARE_ADDR:-127.0.0.1:19000}
PROXY_ADDR=${PROXY_ADDR:-127.0.0.1:18000}
ADMIN_ADDR=${ADMIN_ADDR:-127.0.0.1:18080}
PROXY_BIN=${PROXY_BIN:-}

log() { printf '%s\n' "$*" >&2; }
die() { log "compare: $*"; exit 1; }

for tool in go wrk curl awk; do
	command -v "$tool" >/dev/null || die "$tool not found in PATH"
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, got '$ROUNDS'"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer, got '$CONNS'"

# Load stays on loopback: refuse any other host.
for addr in "$BARE_ADDR" "$PROXY_ADDR" "$ADMIN_ADDR"; do
	[[ $addr =~ ^(127\.[0-9]+\.[0-9]+\.[0-9]+|localhost):[0-9]+$ ]] ||
		die "address '$addr' is not loopback host:port"
done

# to_seconds 10s|2m|1h|10 -> whole seconds, for bounding wrk with timeout.
to_seconds() {
	local n=${1%[smh]} unit=${1##*[0-9]}
	[[ $n =~ ^[0-9]+$ ]] || die "DURATION must look like 10s, 2m or 1h, got '$1'"
	case $unit in
	'' | s) echo "$n" ;;
	m) echo $((n * 60)) ;;
	h) echo $((n * 3600)) ;;
	esac
}
dur_s=$(to_seconds "$DURATION")
((dur_s > 0)) || die "DURATION must be positive"

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/compare-inprocess.XXXXXX")
pids=()

cleanup() {
	local pid i
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	# Give graceful shutdown up to 5s, then force.
	for pid in "${pids[@]}"; do
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ ${KEEP_LOGS:-} == 1 ]]; then
		log "compare: kept $tmp"
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Build.
cd "$root"
log "building into $tmp"
go build -o "$tmp/hiserver" ./cmd/hiserver
case $PROXY_BIN in
'')
	go build -o "$tmp/proxy" ./cmd/proxy
	proxy_cmd=("$tmp/proxy")
	proxy_label="./cmd/proxy"
	;;
hiserver)
	proxy_cmd=("$tmp/hiserver" -listen "$PROXY_ADDR")
	proxy_label="hiserver (PROXY_BIN=hiserver self-check)"
	;;
*)
	[[ -x $PROXY_BIN ]] || die "PROXY_BIN '$PROXY_BIN' is not executable"
	proxy_cmd=("$PROXY_BIN")
	proxy_label=$PROXY_BIN
	;;
esac

# Never benchmark someone else's server left on our ports.
for addr in "$BARE_ADDR" "$PROXY_ADDR" "$ADMIN_ADDR"; do
	if curl -s -o /dev/null --max-time 1 "http://$addr/"; then
		die "something already answers on $addr"
	fi
done

# Start both servers. The proxy gets a clean PROXY_* environment (no config).
"$tmp/hiserver" -listen "$BARE_ADDR" >"$tmp/bare.log" 2>&1 </dev/null &
bare_pid=$!
pids+=("$bare_pid")

unset_proxy_env=()
while IFS= read -r name; do
	unset_proxy_env+=(-u "$name")
done < <(compgen -e | grep '^PROXY_' || true)
env "${unset_proxy_env[@]}" PROXY_HTTP_ADDR="$PROXY_ADDR" PROXY_ADMIN_ADDR="$ADMIN_ADDR" \
	"${proxy_cmd[@]}" >"$tmp/proxy.log" 2>&1 </dev/null &
proxy_pid=$!
pids+=("$proxy_pid")

# wait_ready NAME PID ADDR LOG: poll GET / for up to 10s; body must be "hi".
wait_ready() {
	local name=$1 pid=$2 addr=$3 logf=$4 i body
	for ((i = 0; i < 100; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "compare: $name exited during startup; last log lines:"
			tail -n 20 "$logf" >&2 || true
			exit 1
		fi
		if body=$(curl -fsS --max-time 1 "http://$addr/" 2>/dev/null); then
			[[ $body == hi ]] || die "$name at $addr answered '$body', want 'hi'"
			return 0
		fi
		sleep 0.1
	done
	log "compare: $name not ready on $addr after 10s; last log lines:"
	tail -n 20 "$logf" >&2 || true
	exit 1
}
wait_ready bare "$bare_pid" "$BARE_ADDR" "$tmp/bare.log"
wait_ready proxy "$proxy_pid" "$PROXY_ADDR" "$tmp/proxy.log"

# cpu_ticks PID: utime+stime of the whole process (all threads), in clock
# ticks. Fields are counted after the last ')' because comm may hold spaces.
cpu_ticks() {
	local stat
	stat=$(<"/proc/$1/stat")
	stat=${stat##*) }
	awk '{ print $12 + $13 }' <<<"$stat"
}
clk_tck=$(getconf CLK_TCK)

# run_wrk NAME ADDR PID DURATION: runs wrk, sets rps, p99_ms, cpu_us, errs.
run_wrk() {
	local name=$1 addr=$2 pid=$3 dur=$4 out=$tmp/wrk-$1-$RANDOM.txt t0 t1 reqs
	t0=$(cpu_ticks "$pid")
	timeout -k 5 $((dur_s + 30)) \
		wrk -t1 -c"$CONNS" -d"$dur" --latency "http://$addr/" >"$out" 2>&1 ||
		{ cat "$out" >&2; die "wrk against $name failed"; }
	t1=$(cpu_ticks "$pid")
	rps=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
	reqs=$(awk '/ requests in / { print $1 }' "$out")
	# wrk prints latency as 1.23us / 1.23ms / 1.23s; normalise to ms.
	p99_ms=$(awk '$1 == "99%" {
		v = $2 + 0
		if ($2 ~ /us$/) v /= 1000; else if ($2 ~ /ms$/) ; else if ($2 ~ /m$/) v *= 60000; else if ($2 ~ /s$/) v *= 1000
		printf "%.2f", v }' "$out")
	errs=$(awk '/Non-2xx|Socket errors/ { sub(/^ +/, ""); printf "%s; ", $0 }' "$out")
	[[ -n $rps && -n $reqs && $reqs -gt 0 ]] || { cat "$out" >&2; die "could not parse wrk output for $name"; }
	cpu_us=$(awk -v d=$((t1 - t0)) -v hz="$clk_tck" -v n="$reqs" 'BEGIN { printf "%.1f", d / hz * 1e6 / n }')
	if [[ -n $errs ]]; then
		log "compare: warning: $name: $errs"
	fi
}

log "warming up (2s each)"
run_wrk bare "$BARE_ADDR" "$bare_pid" 2s
run_wrk proxy "$PROXY_ADDR" "$proxy_pid" 2s

log "running $ROUNDS rounds of wrk -t1 -c$CONNS -d$DURATION --latency"
ratios=() bare_rps=() proxy_rps=() bare_cpu=() proxy_cpu=() bare_p99=() proxy_p99=()
for ((r = 1; r <= ROUNDS; r++)); do
	if ((r % 2 == 1)); then order=(bare proxy); else order=(proxy bare); fi
	for side in "${order[@]}"; do
		if [[ $side == bare ]]; then
			run_wrk bare "$BARE_ADDR" "$bare_pid" "$DURATION"
			b_rps=$rps b_p99=$p99_ms b_cpu=$cpu_us
		else
			run_wrk proxy "$PROXY_ADDR" "$proxy_pid" "$DURATION"
			p_rps=$rps p_p99=$p99_ms p_cpu=$cpu_us
		fi
	done
	ratio=$(awk -v p="$p_rps" -v b="$b_rps" 'BEGIN { printf "%.2f", p / b }')
	ratios+=("$ratio") bare_rps+=("$b_rps") proxy_rps+=("$p_rps")
	bare_cpu+=("$b_cpu") proxy_cpu+=("$p_cpu") bare_p99+=("$b_p99") proxy_p99+=("$p_p99")
	printf 'round %d  bare=%s req/s (p99 %sms, cpu %sus/req)  proxy=%s req/s (p99 %sms, cpu %sus/req)  ratio=%s  [order: %s]\n' \
		"$r" "$b_rps" "$b_p99" "$b_cpu" "$p_rps" "$p_p99" "$p_cpu" "$ratio" "${order[*]}"
done

# median V...: middle value, or the mean of the two middle values.
median() {
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
		if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
printf 'median ratio=%.2f  bare=%.0f req/s  proxy=%.0f req/s\n' \
	"$(median "${ratios[@]}")" "$(median "${bare_rps[@]}")" "$(median "${proxy_rps[@]}")"
printf 'median p99   bare=%.2fms  proxy=%.2fms\n' \
	"$(median "${bare_p99[@]}")" "$(median "${proxy_p99[@]}")"
printf 'median cpu   bare=%.1fus/req  proxy=%.1fus/req  (server process utime+stime / requests)\n' \
	"$(median "${bare_cpu[@]}")" "$(median "${proxy_cpu[@]}")"
echo
echo "proxy:    $proxy_label"
echo "commit:   $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
echo "nproc:    $(nproc)"
echo "cpu:      $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
echo "go:       $(go version)"
echo "wrk:      $({ wrk -v 2>&1 || true; } | head -n 1)"
echo "loadavg:  $(cut -d' ' -f1-3 /proc/loadavg) (after run; wrk and both servers share these cores)"
