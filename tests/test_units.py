import pytest

from tabsched import InvalidParameterError, format_quantity, parse_quantity


@pytest.mark.parametrize("text,unit,expected", [
    ("80GB", "B", 80e9),
    ("80 GB", "B", 80e9),
    ("1.5TiB", "B", 1.5 * 2**40),
    ("512MiB", "B", 512 * 2**20),
    ("1e9", "B", 1e9),
    (12, "B", 12.0),
    ("450GB/s", "B/s", 450e9),
    ("400Gb/s", "B/s", 50e9),
    ("400Gbps", "B/s", 50e9),
    ("3.35TB/s", "B/s", 3.35e12),
    ("2us", "s", 2e-6),
    ("2\u00b5s", "s", 2e-6),
    ("1.2ms", "s", 1.2e-3),
    ("500ns", "s", 5e-7),
    ("2min", "s", 120.0),
    ("0.5", "s", 0.5),
    ("1PFLOP/s", "FLOP/s", 1e15),
    ("989TFLOPS", "FLOP/s", 989e12),
    ("2TFLOP", "FLOP", 2e12),
    # what people type (issue 15)
    ("80G", "B", 80e9),
    ("80gb", "B", 80e9),
    ("80 GByte", "B", 80e9),
    ("80 gigabyte".replace("gigabyte", "GBytes"), "B", 80e9),
    ("450 GB/sec", "B/s", 450e9),
    ("450 GB / s", "B/s", 450e9),
    ("450GBps", "B/s", 450e9),
    ("400 Gbit/s", "B/s", 50e9),
    ("400 gbit/s", "B/s", 50e9),
    ("400gbps", "B/s", 50e9),
    ("25 GiB/s", "B/s", 25 * 2**30),
    ("989 tflop/s", "FLOP/s", 989e12),
    ("989 TFLOPs/s", "FLOP/s", 989e12),
    ("989T", "FLOP/s", 989e12),
    ("2 tflop", "FLOP", 2e12),
    ("1.5 sec", "s", 1.5),
    ("20 usec", "s", 2e-5),
    ("2\u03bcs", "s", 2e-6),                                 # Greek mu
    ("2 minutes", "s", 120.0),
    ("1 hour", "s", 3600.0),
    ("3MS", "s", 3e-3),
])
def test_parse(text, unit, expected):
    assert parse_quantity(text, unit) == pytest.approx(expected, rel=1e-15)


def test_sub_unit_times_are_exact():
    # 500 / 1e9, not 500 * 1e-9 (which is 5.000000000000001e-07)
    assert parse_quantity("500ns", "s") == 5e-7
    assert parse_quantity("5us", "s") == 5e-6


@pytest.mark.parametrize("text,unit,message", [
    ("80XB", "B", r"^memory_budget: '80XB' is not a size \(expected e\.g\. 80GB; accepted "
                  r"forms: 80GB, 80 GiB, 80G, 80gb, 80 GByte\)$"),
    ("80GB/s", "B", r"'80GB/s' is not a size"),
    ("80GB", "B/s", r"'80GB' is not a bandwidth \(expected e\.g\. 450GB/s; accepted forms: "
                    r"450GB/s, 450 GB/sec, 450GBps, 400Gb/s, 400 Gbit/s, 400Gbps\)"),
    ("2 parsecs", "s", r"'2 parsecs' is not a time \(expected e\.g\. 1\.2ms; accepted forms"),
    ("400gb/s", "B/s", r"^'400gb/s' is ambiguous: write 400GB/s for bytes or 400Gbit/s for "
                       r"bits per second$"),
    ("1e999GB", "B", r"'1e999GB' is not a finite number"),
    ("\u0668GB", "B", r"is not a size"),                  # Arabic-Indic digit eight
    ("\uff18\uff10GB", "B", r"is not a size"),            # fullwidth 80
    (float("nan"), "s", r"nan is not a finite number"),
    ("8" * 5000 + "XB", "B", r"^'8{40}\.\.\.' is not a size"),
    ("1PB/s", "FLOP/s", r"'1PB/s' is not a compute rate"),
    ("fast", "B/s", r"'fast' is not a bandwidth"),
    (True, "B", r"True is not a size"),
])
def test_parse_errors_name_the_value(text, unit, message):
    with pytest.raises(InvalidParameterError, match=message):
        parse_quantity(text, unit, name="memory_budget" if "memory" in message else None)


@pytest.mark.parametrize("value,unit,text", [
    (80e9, "B", "80 GB"),
    (54_895_050_752, "B", "54.9 GB"),
    (999.7e9, "B", "1 TB"),
    (512, "B", "512 B"),
    (0, "B", "0 B"),
    (450e9, "B/s", "450 GB/s"),
    (1e15, "FLOP/s", "1 PFLOP/s"),
    (3.948, "s", "3.95 s"),
    (0.0012, "s", "1.2 ms"),
    (0.00099996, "s", "1 ms"),
    (2e-6, "s", "2 us"),
    (5e-7, "s", "500 ns"),
    (0.0, "s", "0 s"),
    (2e-16, "s", "0 s"),
])
def test_format(value, unit, text):
    assert format_quantity(value, unit) == text


@pytest.mark.parametrize("text,unit", [("80 GB", "B"), ("450 GB/s", "B/s"), ("1.2 ms", "s"),
                                       ("500 ns", "s"), ("1 PFLOP/s", "FLOP/s")])
def test_format_and_parse_round_trip(text, unit):
    assert format_quantity(parse_quantity(text, unit), unit) == text


@pytest.mark.parametrize("value,expected", [
    (3e6, "3000000"), (1.23654e6, "1236540"), (27.0, "27"), (2.3127, "2.3127"),
    (1 / 3, "0.333333"), (2.5e-7, "0.00000025"), (-4.5, "-4.5"), (0.0, "0"),
    (float("nan"), "nan"), (1e20, "100000000000000000000"),
])
def test_numbers_a_user_reads_are_never_in_scientific_notation(value, expected):
    from tabsched.costs.units import format_number
    assert format_number(value) == expected
    assert "e+" not in format_number(value) and "e-" not in format_number(value)


def test_counts_take_a_thousands_prefix():
    from tabsched.costs.units import format_count
    assert [format_count(v) for v in (1.008e12, 8.03e9, 950, 46.7e9, 999.96e9)] == [
        "1.01T", "8.03B", "950", "46.7B", "1T"]


def test_human_output_has_no_scientific_notation(cli):
    code, out, _ = cli("eval", "gpipe", "-p", "1", "-m", "100000")
    assert code == 0 and "makespan      300000 slots" in out and "e+" not in out
    code, out, _ = cli("presets")
    assert code == 0 and "1.01T" in out and "e+" not in out
