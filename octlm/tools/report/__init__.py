"""The run report and the schedule playground: one self-contained HTML page per call.

`runs` reads run folders into plain data, `presets` reads the shipped configs' schedules, and
`report` inlines the `assets/` (template, CSS, JS) with that data embedded as JSON.
"""
