"""sweeper/report: the HTML report and the records it draws."""
