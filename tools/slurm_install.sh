#!/bin/sh
# Debian's Slurm (slurmctld, slurmd, the client commands) and munge for the Slurm tests.
#
# Installs only what is missing, only as root with apt-get; otherwise prints a note and changes nothing.
# Nothing is started or enabled: the tests start a private cluster of their own (tests/slurmcluster.py).
# Exit status: 0 when every command the tests need is present afterwards, 1 when some are still missing
# (the tests then skip locally, and fail under CI=true).
set -u

NEEDED="slurmctld slurmd sbatch srun squeue scontrol scancel sinfo munged mungekey"

missing() {
    out=""
    for cmd in $NEEDED; do
        # slurmctld, slurmd and munged live in /usr/sbin, which a non-root PATH may lack
        if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ]; then
            out="$out $cmd"
        fi
    done
    echo "$out"
}

gone=$(missing)
if [ -z "$gone" ]; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: Slurm is not installed (missing:$gone) and this is not root with apt-get;" \
         "Slurm tests will skip (or fail with CI=true)."
    echo "      as root: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
    exit 1
fi

echo "installing Slurm and munge for the Slurm tests (missing:$gone)"
export DEBIAN_FRONTEND=noninteractive
# Debian's maintainer scripts try to start the daemons; with no init system that fails harmlessly, but
# policy-rc.d makes sure nothing is started even where an init system exists. Removed again afterwards.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
fi
if ! apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
        || echo "warning: could not install Slurm; Slurm tests will skip (or fail with CI=true)"
fi
if [ "$made_policy" = 1 ]; then
    rm -f "$policy"
fi

gone=$(missing)
if [ -n "$gone" ]; then
    echo "warning: still missing after install:$gone"
    exit 1
fi
exit 0
