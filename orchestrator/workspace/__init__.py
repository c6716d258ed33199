"""The workspace: its private copy, the review and apply of changes, checkpoints, the integrity sweep,
the write quota and the session records. Everything here reads box-written files through boxfs."""
