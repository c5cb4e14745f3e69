"""Maps the config's log retention in days (a plain int) onto CDK's RetentionDays enum."""

from aws_cdk import aws_logs as logs

_BY_DAYS = {
    1: "ONE_DAY",
    3: "THREE_DAYS",
    5: "FIVE_DAYS",
    7: "ONE_WEEK",
    14: "TWO_WEEKS",
    30: "ONE_MONTH",
    60: "TWO_MONTHS",
    90: "THREE_MONTHS",
    120: "FOUR_MONTHS",
    150: "FIVE_MONTHS",
    180: "SIX_MONTHS",
    365: "ONE_YEAR",
    400: "THIRTEEN_MONTHS",
    545: "EIGHTEEN_MONTHS",
    731: "TWO_YEARS",
    1096: "THREE_YEARS",
    1827: "FIVE_YEARS",
    2192: "SIX_YEARS",
    2557: "SEVEN_YEARS",
    2922: "EIGHT_YEARS",
    3288: "NINE_YEARS",
    3653: "TEN_YEARS",
}


def retention(days: int) -> logs.RetentionDays:
    """config_sections.LOG_RETENTION_DAYS lists the same values; config validation rejects any other."""
    return getattr(logs.RetentionDays, _BY_DAYS[days])
