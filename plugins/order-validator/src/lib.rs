//! Order validator: ACKs orders that have every required field with a sensible value, NACKs the
//! rest with the reason in the log. With `maxNackRetries: 0` invalid orders go straight to the
//! dead-letter topic `__dlq.<consumerId>`, where someone can look at them, while valid ones flow.

use mmmq_plugin_sdk::{Ack, Message, warn};
use serde::Deserialize;

/// One line of an order.
#[derive(Debug, Deserialize)]
pub struct Item {
    /// Stock keeping unit.
    pub sku: String,
    /// How many.
    pub quantity: u32,
}

/// An order as producers send it.
#[derive(Debug, Deserialize)]
pub struct Order {
    /// Order id.
    pub id: String,
    /// Who ordered.
    pub customer: String,
    /// Total amount.
    pub amount: f64,
    /// ISO 4217 code.
    pub currency: String,
    /// What was ordered.
    pub items: Vec<Item>,
}

/// Why an order is refused, or `Ok`.
pub fn validate(msg: &Message) -> Result<Order, String> {
    let order: Order = msg.json().map_err(|e| format!("not an order: {e}"))?;
    if order.id.trim().is_empty() {
        return Err("id is empty".into());
    }
    if order.customer.trim().is_empty() {
        return Err("customer is empty".into());
    }
    if !(order.amount.is_finite() && order.amount > 0.0) {
        return Err(format!("amount {} is not positive", order.amount));
    }
    if order.currency.len() != 3 || !order.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "currency {:?} is not an ISO 4217 code",
            order.currency
        ));
    }
    if order.items.is_empty() {
        return Err("no items".into());
    }
    if let Some(item) = order
        .items
        .iter()
        .find(|i| i.quantity == 0 || i.sku.is_empty())
    {
        return Err(format!("item {:?} has no sku or a zero quantity", item.sku));
    }
    Ok(order)
}

/// ACK valid orders, NACK the rest.
pub fn handle(msg: Message) -> Ack {
    match validate(&msg) {
        Ok(_) => Ack::Ack,
        Err(why) => {
            warn!("refusing {} offset {}: {why}", msg.topic, msg.offset);
            Ack::Nack
        }
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;

    fn order(json: &str) -> Ack {
        handle(Message::new("order.created", json))
    }

    #[test]
    fn a_complete_order_is_acknowledged() {
        assert_eq!(
            order(
                r#"{"id":"o-1","customer":"c-1","amount":12.5,"currency":"EUR","items":[{"sku":"A","quantity":2}]}"#
            ),
            Ack::Ack
        );
    }

    #[test]
    fn missing_or_bad_fields_are_refused_with_a_reason() {
        let cases = [
            (
                r#"{"customer":"c","amount":1,"currency":"EUR","items":[{"sku":"A","quantity":1}]}"#,
                "missing field `id`",
            ),
            (
                r#"{"id":"o","customer":"","amount":1,"currency":"EUR","items":[{"sku":"A","quantity":1}]}"#,
                "customer is empty",
            ),
            (
                r#"{"id":"o","customer":"c","amount":0,"currency":"EUR","items":[{"sku":"A","quantity":1}]}"#,
                "not positive",
            ),
            (
                r#"{"id":"o","customer":"c","amount":1,"currency":"euro","items":[{"sku":"A","quantity":1}]}"#,
                "ISO 4217",
            ),
            (
                r#"{"id":"o","customer":"c","amount":1,"currency":"EUR","items":[]}"#,
                "no items",
            ),
            (
                r#"{"id":"o","customer":"c","amount":1,"currency":"EUR","items":[{"sku":"A","quantity":0}]}"#,
                "zero quantity",
            ),
            ("[1,2,3]", "not an order"),
        ];
        for (json, why) in cases {
            let err = validate(&Message::new("order.created", json)).unwrap_err();
            assert!(err.contains(why), "{json}: {err}");
            assert_eq!(order(json), Ack::Nack);
        }
    }
}
