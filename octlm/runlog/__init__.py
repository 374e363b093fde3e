"""The run log: `OUT/log.jsonl`, one JSON object per line, flushed per line.

Record types: `header` (settings, model, counts, build, git commit), `step`, `val`, `hash`,
`tensors` (--hash-tensors: beside each `hash`, `weights` and `grads`, {name: 16-hex digest};
a resume adds one with the loaded `weights` only, `loaded: true`), `event` (resume, stop,
nonfinite) and `end` (final step and weights_sha256).

Step numbers (schema 2, `log_schema` in the header): one count everywhere, the optimizer steps
done. The record of the first step says `step: 1`, a validation or hash after step N says N, as
do a checkpoint written then (`step_00000N`), a stop or resume event there and the `end` of an
N-step run; `nonfinite` names the step that failed. Schema 1 (no `log_schema`: logs written
before) numbered step/val/hash/nonfinite records from 0; `read_log` shifts them to schema 2, so
every tool reads one convention, and a resumed schema-1 run keeps writing schema 1, so its file
never mixes the two.

After a resume the file reads as one run: the records past the checkpoint's step are dropped
before new ones are appended. The schema lives in this package: the loop hands objects to the
typed writers (`writer.RunLog`), and every tool reads through `reader.read_log`, which skips a
line cut short by a kill instead of failing.
"""
