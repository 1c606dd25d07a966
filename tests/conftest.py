pytest_plugins = [
    "tests.support.pg",
]
