#!/usr/bin/env bash
# A one-node Slurm on this machine (for the slurm tests, and for trying slurm/*.sbatch locally).
#
#   scripts/slurm-local.sh start DIR   install slurm-wlm + munge if missing, write DIR/slurm.conf,
#                                      start munged, slurmctld, slurmd; wait until the node is idle
#   scripts/slurm-local.sh stop DIR    stop the daemons started by `start DIR` (by pid), nothing else
#   scripts/slurm-local.sh env DIR     print `export SLURM_CONF=...` (eval it to use sbatch/squeue)
#
# DIR holds everything (config, munge key and socket, state, spool, logs, pids), so the cluster is
# private to DIR and never touches /etc/slurm or a system munged. Runs as root (SlurmUser=root), as
# in CI containers. Ports: DZ_SLURM_PORT (slurmctld, default 6817) and DZ_SLURM_PORT+1 (slurmd), or
# the next free pair.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -eq 2 ] || usage
CMD=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)  # absolute: slurmctld/slurmd need an absolute config path
CONF=$DIR/slurm.conf
say() { echo "[slurm-local] $*"; }

install_if_missing() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
    command -v munged >/dev/null && return 0
  say "installing slurm-wlm and munge (apt-get)"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq slurm-wlm munge >/dev/null
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_conf() {
  local host cpus mem port
  host=$(hostname -s)
  cpus=$(nproc)
  # Leave some memory to the OS; config_overrides also keeps slurmd from draining the node when the
  # measured memory differs a little.
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  port=${DZ_SLURM_PORT:-6817}
  # another cluster on this machine (a real one, or a second test) holds the port: take the next
  while port_busy "$port" || port_busy $((port + 1)); do port=$((port + 2)); done
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
  cat >"$CONF" <<EOF
# Written by scripts/slurm-local.sh: a private one-node cluster in $DIR
ClusterName=dzlocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits cred_expire + 1 s before it may start again (default 120)
AuthInfo=socket=$DIR/run/munge.socket,cred_expire=${DZ_SLURM_CRED_EXPIRE:-10}
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
# Short waits: scancel's SIGTERM -> SIGKILL gap, and how long finished jobs stay visible.
KillWait=30
MinJobAge=600
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
  # A private munged on a socket in DIR (the key is made here, owned by root, mode 0400).
  if [ ! -s "$DIR/run/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/run/munge.key" bs=1 count=1024 status=none
    chmod 0400 "$DIR/run/munge.key"
  fi
  munged --force --socket="$DIR/run/munge.socket" --key-file="$DIR/run/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/run/munge.seed"
  for _ in $(seq 50); do [ -s "$DIR/run/munged.pid" ] && [ -S "$DIR/run/munge.socket" ] && break; sleep 0.1; done
  [ -S "$DIR/run/munge.socket" ] || { say "munged did not start:"; tail -5 "$DIR/log/munged.log"; exit 1; }
  cp "$DIR/run/munged.pid" "$DIR/run/started.munged.pid"
}

wait_idle() {
  local host; host=$(hostname -s)
  for i in $(seq 120); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
    case $state in
      idle*|mix*|alloc*) return 0 ;;
      drain*|down*) [ "$i" -gt 10 ] && scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
  done
  say "the node did not become idle (state '${state:-?}'); logs:"
  tail -20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" 2>/dev/null
  return 1
}

start() {
  install_if_missing
  if [ -s "$DIR/run/started.slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/started.slurmctld.pid")" 2>/dev/null; then
    say "already running in $DIR"; return 0
  fi
  write_conf
  export SLURM_CONF=$CONF
  start_munge
  # -D (foreground) in the background, so $! is the daemon's own pid; -c/-i: no state carried over.
  slurmctld -D -c -i -f "$CONF" >>"$DIR/log/slurmctld.out" 2>&1 &
  echo $! >"$DIR/run/started.slurmctld.pid"
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
  slurmd -D -f "$CONF" -N "$(hostname -s)" >>"$DIR/log/slurmd.out" 2>&1 &
  echo $! >"$DIR/run/started.slurmd.pid"
  if ! wait_idle; then stop; exit 1; fi
  say "up: $(sinfo -h -o '%P %D nodes %c cpus %t')  (export SLURM_CONF=$CONF)"
}

stop_pid() {  # stop_pid NAME: SIGTERM the daemon we started, SIGKILL after 10 s
  local f="$DIR/run/started.$1.pid" pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop() {
  export SLURM_CONF=$CONF
  # Jobs first (their slurmstepd processes belong to this cluster), then the daemons.
  if [ -s "$DIR/run/started.slurmctld.pid" ] && command -v scancel >/dev/null; then
    timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  stop_pid slurmd
  stop_pid slurmctld
  stop_pid munged
  say "stopped ($DIR)"
}

case $CMD in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) usage ;;
esac
