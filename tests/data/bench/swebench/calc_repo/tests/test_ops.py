from calc import add, mul, power


def test_add():
    assert add(2, 3) == 5


def test_mul_positive():
    assert mul(4, 3) == 12


def test_power():
    assert power(2, 5) == 32
