"""``python -m nsqworker``: the ``nsqworker`` command."""

# The guard matters: worker processes are started with "spawn", which imports the
# parent's __main__ module again under another name.
if __name__ == "__main__":
    from nsqworker.cli import main

    main()
