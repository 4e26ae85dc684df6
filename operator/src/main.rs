fn main() {
    print!("{}", outbox_operator::crdgen::crd_yaml());
}
