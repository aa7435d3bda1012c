#!/bin/sh
# A one-node Slurm on this machine for the tests: slurmctld and slurmd on localhost with a
# slurm.conf of their own in DIR (their own ports, state and logs), munge started if it is
# not running. `start DIR` prints the SLURM_CONF to use and exits 0 once the node is idle,
# or prints why not and exits 1 (`skip: ...` when Slurm or munge is not installed or this
# is not root); `stop DIR` ends the daemons it started.
set -u
command_=$1
dir=$2
conf=$dir/slurm.conf
case $command_ in
stop)
  for daemon in slurmd slurmctld munged; do
    [ -f "$dir/$daemon.pid" ] && kill "$(cat "$dir/$daemon.pid")" 2>/dev/null
  done
  exit 0 ;;
start) ;;
*) echo "usage: $0 start|stop DIR"; exit 2 ;;
esac
for tool in slurmctld slurmd srun sinfo munged munge; do
  command -v $tool > /dev/null 2>&1 || { echo "skip: $tool is not installed (apt-get install slurm-wlm munge)"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "skip: the daemons of a test Slurm need root"; exit 1; }
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
  [ -f /etc/munge/munge.key ] || { echo "skip: munge has no key (/etc/munge/munge.key)"; exit 1; }
  mkdir -p /run/munge && chown munge:munge /run/munge 2> /dev/null
  munged --force --pid-file="$dir/munged.pid" 2> "$dir/log/munged.log" || { echo "munged did not start"; exit 1; }
fi
host=$(hostname)
port=$((17000 + ($$ % 1000) * 2))
cat > "$conf" <<CONF
ClusterName=adjoint-test
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
ReturnToService=2
SlurmUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
SLURM_CONF=$conf slurmctld -i -f "$conf" || { echo "slurmctld did not start; see $dir/log"; exit 1; }
SLURM_CONF=$conf slurmd -f "$conf" || { echo "slurmd did not start; see $dir/log"; exit 1; }
for _ in $(seq 50); do
  SLURM_CONF=$conf sinfo -h -o %t 2> /dev/null | grep -q idle && { echo "$conf"; exit 0; }
  sleep 0.2
done
echo "the test Slurm's node did not become idle; see $dir/log"
exit 1
