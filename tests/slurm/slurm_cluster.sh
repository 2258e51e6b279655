#!/usr/bin/env bash
# Starts (or stops) a one-node Slurm cluster on this host for the tests: munged, slurmctld and
# slurmd with a minimal slurm.conf under $SLURM_TEST_DIR. Facts that matter here: NodeName must
# be `hostname -s`; proctrack/linuxproc and task/none avoid cgroups; clients need SLURM_CONF.
# Usage: slurm_cluster.sh start|stop DIR
set -eu
cmd=$1 dir=$2
conf=$dir/slurm.conf
host=$(hostname -s)

stop() {
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi

mkdir -p "$dir/state" "$dir/spool" "$dir/munge" "$dir/log"
chmod 700 "$dir/munge"
# munge: a key of our own and a socket in our directory, so nothing system-wide is touched.
[ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"

# A test cluster's timers, not a production site's: a killed job's surviving ranks get SIGKILL
# kill_wait seconds after SIGTERM (Slurm's default 30), and a requeued job may start again
# cred_expire seconds after it was requeued (Slurm's default 120). test_slurm.sh reads both
# back from slurm.conf to bound what is pdtrain's own part of a recovery.
kill_wait=5 cred_expire=30
cat >"$conf" <<CONF
ClusterName=pdtrain-test
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=$cred_expire
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=$kill_wait
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$host CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$conf
slurmctld -c -f "$conf"
slurmd -f "$conf"
for _ in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mix"; then echo "slurm: up ($conf)"; exit 0; fi
  sleep 1
done
echo "slurm: node did not come up"; sinfo || true; tail -20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log"; stop; exit 1
