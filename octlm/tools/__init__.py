"""Commands that read or launch runs: verify-resume, sweep, diff, analyze, plot, export, report.

They use `octlm.trainer` only through its public functions and start training runs only through
`subrun`; nothing under `octlm.trainer` imports them.
"""
