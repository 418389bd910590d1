"""Run one replica of a NotebookOS distributed kernel (see notebookos.kernel.app)."""

from notebookos.kernel.app import main

if __name__ == "__main__":
    main()
