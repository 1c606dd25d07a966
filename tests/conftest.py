pytest_plugins = [
    "tests.support.pg",
    "tests.support.gcp_fake",
    "tests.support.moto",
    "tests.support.aws_calls",
    "tests.support.aws_stub",
]
