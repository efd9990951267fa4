"""`python -m manager`: the `overlay` entry point (manager.fastpath, then the CLI)."""

from manager.fastpath import main

if __name__ == "__main__":
    main()
