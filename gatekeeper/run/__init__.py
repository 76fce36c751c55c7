"""Running a job: its settings, the submit loop, collection, rebuild, the library entry points, the summary."""
