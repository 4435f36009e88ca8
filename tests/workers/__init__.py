"""Worker-runtime test helpers and the scripts the tests run as subprocesses."""
