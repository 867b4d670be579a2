mod catalog;
mod fuzz;
mod layers;
mod props;
mod query;
mod rules;
mod store;
mod take;
