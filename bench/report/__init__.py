"""What leaves MoE Bench for people and other tools: plotly figures (:mod:`~bench.report.figures`,
in the shared style of :mod:`~bench.report.style`), the self-contained HTML report
(:mod:`~bench.report.html`) and the CSV exports (:mod:`~bench.report.csv_export`)."""
