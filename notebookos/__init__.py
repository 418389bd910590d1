"""NotebookOS core: configuration, cluster model, policies, protocol, store, simulator, CLI.

Dependency rule: this package imports none of the four components (``notebookos.kernel``,
``notebookos.provisioner``, ``notebookos.global_scheduler``, ``notebookos.local_scheduler``),
except the CLI entry points that start them. See docs/architecture.md.
"""

__version__ = "0.1.0"
