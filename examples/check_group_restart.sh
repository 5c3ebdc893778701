#!/usr/bin/env bash
# A collective job that survives a killed rank (issue 32: torchrun's --max-restarts contract):
#   check_group_restart.sh <mnist_mlp> <gradus-run> <mnist dir> ["MPIRUN ARGS"]
# 1. gradus-run -np 2 --comm ring, 3 epochs straight: the reference;
# 2. the same with --max-restarts 1 --checkpoint F --resume, rank 1 SIGKILLed (at its first
#    start) as soon as epoch 1's checkpoint exists: gradus-run stops rank 0, starts both again,
#    they resume at epoch 2 from the checkpoint (rank 0 reads it and broadcasts it), the job
#    exits 0, its final line counts the restart and names its cause, the JSON line says
#    restarts 1 and start_epoch 2, and final_loss and test_accuracy equal the straight run's;
# 3. with --max-restarts 0 the same kill fails the job, naming rank 1;
# 4. given an mpirun command (one argument, words split): --comm mpi under that mpirun, the
#    same kill, gradus-run --max-restarts 1 supervising mpirun (it starts the ranks itself):
#    mpirun fails, gradus-run starts it again, the ranks resume at epoch 2 and end with the
#    straight mpirun job's loss and accuracy.
# Every wait is bounded (timeout).
set -u -o pipefail
exe=$1 run=$2 data=$3 mpirun=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_group_restart: $*" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
json0() { grep -E '^\[[0-9a-z]+\] \{' | tail -1 | sed -E 's/^\[[0-9a-z]+\] //'; }
args=(--data "$data" --comm ring --epochs 3 --train-limit 12000 --seed 1 --threads 1 --quiet --json)
ck=$work/run/ckpt.npz

straight=$(OMP_NUM_THREADS=1 timeout 180 "$run" -np 2 "$exe" "${args[@]}" 2>"$work/err" | json0) ||
  { cat "$work/err" >&2; fail "3 epochs straight failed"; }

# Rank 1's first start: the program in the background, SIGKILLed with this wrapper (its
# process group) once rank 0 has written epoch 1's checkpoint (at most 60 s).
cat >"$work/rank.sh" <<EOF
#!/usr/bin/env bash
if [[ \${RANK:-\$OMPI_COMM_WORLD_RANK} == 1 && -z \${GRADUS_RESTART_COUNT:-} ]]; then
  "$exe" "\$@" &
  for _ in \$(seq 6000); do [[ -e "$ck" ]] && break; sleep 0.01; done
  kill -9 0
fi
exec "$exe" "\$@"
EOF
chmod +x "$work/rank.sh"

out=$(OMP_NUM_THREADS=1 timeout 240 "$run" -np 2 --max-restarts 1 --restart-delay 0.5 "$work/rank.sh" "${args[@]}" \
  --checkpoint "$ck" --resume 2>"$work/err")
rc=$?
[[ $rc == 0 ]] || { cat "$work/err" >&2; fail "the job with a killed rank and --max-restarts 1 exited $rc"; }
grep -q "^gradus-run: rank 1 was killed by signal 9 (Killed); stopping the other ranks and restarting all 2 in 0.5 s (restart 1 of 1)$" "$work/err" ||
  { cat "$work/err" >&2; fail "no group restart line"; }
last=$(tail -1 "$work/err")
[[ $last == "gradus-run: finished: the workers exited 0 (restarts used: 1 of 1, after: rank 1 was killed by signal 9 (Killed))" ]] ||
  fail "final line: $last"
resumed=$(printf '%s\n' "$out" | json0)
[[ -n $resumed ]] || fail "no JSON line from rank 0: $out"
[[ $(field "$resumed" restarts) == 1 ]] || fail "the JSON line says restarts $(field "$resumed" restarts): $resumed"
[[ $(field "$resumed" start_epoch) == 2 ]] ||
  fail "the restarted job began at epoch $(field "$resumed" start_epoch), not 2 (the kill came late?): $resumed"
for key in final_loss test_accuracy; do
  a=$(field "$straight" $key) b=$(field "$resumed" $key)
  [[ $a == "$b" ]] || fail "$key is $a straight, $b after the restart"
  echo "restarted ring job: $key = $a both ways"
done

# Without restarts the kill fails the job, naming rank 1.
rm -rf "$work/run"
OMP_NUM_THREADS=1 timeout 120 "$run" -np 2 "$work/rank.sh" "${args[@]}" --checkpoint "$ck" --resume >/dev/null 2>"$work/err"
rc=$?
[[ $rc == 137 ]] || { cat "$work/err" >&2; fail "without --max-restarts the job exited $rc, not 137"; }
[[ $(tail -1 "$work/err") == "gradus-run: failed: rank 1 was killed by signal 9 (Killed)" ]] ||
  fail "final line without restarts: $(tail -1 "$work/err")"

if [[ -n $mpirun ]]; then
  read -r -a mpi <<<"$mpirun"
  margs=("${args[@]}")
  margs[3]=mpi  # --comm mpi
  rm -rf "$work/run"
  straight=$(OMP_NUM_THREADS=1 timeout 180 "${mpi[@]}" -np 2 "$exe" "${margs[@]}" 2>"$work/err" | grep -E '^\{' | tail -1) ||
    { cat "$work/err" >&2; fail "3 epochs straight under mpirun failed"; }
  out=$(OMP_NUM_THREADS=1 timeout 240 "$run" --max-restarts 1 --restart-delay 0.5 "${mpi[@]}" -np 2 "$work/rank.sh" \
    "${margs[@]}" --checkpoint "$ck" --resume 2>"$work/err")
  rc=$?
  [[ $rc == 0 ]] || { cat "$work/err" >&2; fail "the mpirun job with a killed rank and --max-restarts 1 exited $rc"; }
  name=$(basename "${mpi[0]}")
  grep -qE "^gradus-run: $name exited with status [0-9]+(: .*)?; restarting it in 0.5 s \(restart 1 of 1\)$" "$work/err" ||
    { cat "$work/err" >&2; fail "no restart line for $name"; }
  resumed=$(printf '%s\n' "$out" | json0)
  [[ $(field "$resumed" restarts) == 1 && $(field "$resumed" start_epoch) == 2 ]] ||
    fail "the restarted mpirun job: $resumed"
  for key in final_loss test_accuracy; do
    a=$(field "$straight" $key) b=$(field "$resumed" $key)
    [[ $a == "$b" ]] || fail "$key is $a under mpirun straight, $b after the restart"
    echo "restarted mpirun job: $key = $a both ways"
  done
fi
echo "check_group_restart: ok"
