"""The gRPC protocol (package ``notebookos.v1``) between the Global and Local Schedulers."""
