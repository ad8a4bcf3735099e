"""From measurements to what a reader sees: the statistics (`stats`: paired intervals, the A/A
noise floor, verdicts), the headline (`headline`), report.md (`document`), the terminal tables
(`terminal`), the plots (`plots`), where the figures come from (`provenance`), the files a run
writes (`output`) and the number formatting they share (`text`)."""
