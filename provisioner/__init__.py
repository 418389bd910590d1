"""The jupyter_client KernelProvisioner, kernelspecs and the Jupyter Server extension."""
