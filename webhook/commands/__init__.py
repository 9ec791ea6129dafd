"""The flags of the commands whose code is heavy, apart from that code.

Building the ``webhook`` parser imports every command's flags. Each module here defines one
command's flags with argparse and constants only, and a handler that imports the command's
module (aiohttp, the Kubernetes client, the audit review ...) when that command runs, so a
command that reads files starts fast.
"""
