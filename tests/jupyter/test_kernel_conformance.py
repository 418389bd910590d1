"""jupyter_kernel_test's KernelTests for the `notebookos` kernelspec, through the whole stack:
jupyter_client's KernelManager -> NotebookOS provisioner -> Global Scheduler -> three Local
Schedulers -> three replicas. Each check wants busy / input / output / idle once and in order.
"""

from __future__ import annotations

import jupyter_kernel_test
import pytest


@pytest.fixture(scope="module", autouse=True)
def _cluster(nbos_cluster: object) -> None:
    """KernelTests.setUpClass starts its kernel through the module's cluster."""


class NotebookOSKernelTests(jupyter_kernel_test.KernelTests):
    kernel_name = "notebookos"
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('oops', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


