pytest_plugins = [
    "tests.support.pg",
    "tests.support.gcp_fake",
    "tests.support.moto",
]
