"""Running a job: the library's entry points (`_submit`) and the submit loop (`_loop`) above the lanes they turn,
each a package: `batch/`, `realtime/`, `recovery/`, and `shared/`, what every lane shares."""
