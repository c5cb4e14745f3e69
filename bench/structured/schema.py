"""The product-attributes JSON schema both structured-output benchmarks constrain sampling with
(strings with maxLength, an enum, a number, a boolean, an array of objects); no imports, so the
library comparison can load it in its throw-away virtualenv."""

SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "maxLength": 40},
        "category": {"enum": ["shoes", "electronics", "books", "toys"]},
        "max_price": {"type": "number"},
        "in_stock": {"type": "boolean"},
        "attributes": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "value": {"type": "string", "maxLength": 12},
                },
                "required": ["name", "value"],
            },
        },
    },
    "required": ["query", "category", "max_price", "in_stock", "attributes"],
    "additionalProperties": False,
}
