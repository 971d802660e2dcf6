"""The one exception type the CLI turns into a one-line error and exit code."""


class ParacellError(Exception):
    """A failure the user can act on; its text is the whole error message."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NotExistError(ParacellError):
    """runc's wording, which containerd matches on."""

    def __init__(self, container_id: str) -> None:
        super().__init__(f"container {container_id} does not exist")


class NotRunningError(ParacellError):
    def __init__(self) -> None:
        super().__init__("container not running")
